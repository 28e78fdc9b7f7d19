"""``models bench``: what the decoder session costs on this machine, in numbers.

Other processes share the cores, so timings are noisy and mostly *too slow*. Hence:

* every time is the best of a few repetitions (the run least disturbed by others);
* the three percentages are ratios of *work*: process CPU time, best against best, on a
  session whose threads do not spin (spin-waiting would count as CPU time). Unlike wall
  time, CPU time is not inflated by whoever else runs; the wall-time ratios are logged.

The keys of :func:`run_bench`'s result are a contract (``--json`` prints exactly these, and
``bench`` and the README's results read them; docs/models.md):

* ``load_s`` — :meth:`DecoderSession.load` wall time (onnxruntime session + tokenizer).
* ``prefill_tokens_per_s`` — a 256-token prompt fed in one step, no prefix cache.
* ``decode_ms_per_token`` — per-step time of a 128-token greedy generation after a short
  prompt (median step of a run, best run).
* ``kv_bytes_per_token`` — float32 keys + values over all layers for one position.
* ``snapshot_ms`` / ``restore_ms`` — :meth:`DecoderSession.park` / :meth:`resume` of a job
  with 256 positions of KV. Parking keeps the KV by reference, so these are tiny.
* ``snapshot_resume_ms`` / ``recompute_resume_ms`` — resume + the next token for a job
  paused at 256 positions (192 system prompt, 32 question, 32 generated), from its
  snapshot vs. from its record alone (re-prefill; in exact-replay mode the 32 generated
  tokens are re-fed one per pass, see ``feed_plan``).
* ``resume_overhead_pct`` — a 128-token generation paused once at token 64 and resumed
  from its snapshot, against the same generation uninterrupted: the work the resume adds,
  counted and timed piece by piece (see :func:`resume_overhead`), with
  ``resume_overhead_noise_pct`` (its spread over the repetitions) and the counts
  ``resume_extra_passes``, ``resume_extra_kv_buffers``, ``resume_copied_bytes``, and
  ``resume_added_ms`` (park + resume + rebind) against ``resume_step_ms`` (a step).
* ``partial_evict_saving_pct`` — resume of that paused job after trimming it to its
  192-token system prompt, against a full recompute of its 256 positions.
* ``prefix_cache_ttft_saving_pct`` — time to first token of a job with a 192-token system
  prompt and a 32-token question, prefix cache hit vs. cold.
* ``peak_rss_mb`` — the process's peak resident memory (``ru_maxrss``).
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniun.models.generate import Generation
from uniun.models.session import DecoderSession

__all__ = ["BENCH_KEYS", "run_bench"]

BENCH_KEYS = ("load_s", "prefill_tokens_per_s", "decode_ms_per_token", "kv_bytes_per_token",
              "snapshot_ms", "restore_ms", "snapshot_resume_ms", "recompute_resume_ms",
              "resume_overhead_pct", "resume_overhead_noise_pct", "resume_extra_passes",
              "resume_extra_kv_buffers", "resume_copied_bytes", "resume_added_ms",
              "resume_step_ms", "partial_evict_saving_pct", "prefix_cache_ttft_saving_pct",
              "peak_rss_mb")

CONTEXT = 256  # positions of the paused job
SYSTEM = 192  # static prefix kept by partial eviction / shared through the prefix cache
ANSWERED = 32  # tokens the paused job has generated (192 system + 32 question + 32 answer)
GEN = 128  # tokens of the decode and resume-overhead generations

_FILLER = (
    "You are a careful assistant that runs on a small device. Answer briefly and "
    "truthfully; say when you do not know. The user keeps notes about meetings, books, "
    "travel plans and recipes, and asks questions about them during the day. "
)


class _Clock:
    """Wall and process-CPU seconds of the calls it times, summed."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn(*args)
        self.wall += time.perf_counter() - w0
        self.cpu += time.process_time() - c0
        return out


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    clock = _Clock()
    out = clock(fn, *args)
    return clock.wall, out


def _resume_step(session: DecoderSession, parked: Any) -> Any:
    """Resume a parked job and decode its next token (what a resume costs a user)."""
    return session.step(session.resume(parked))


def _recompute_step(session: DecoderSession, record: Any) -> Any:
    """Rebuild a job from its record alone and decode its next token."""
    return session.step(session.recompute(record))


def _saving(fast: list[_Clock], slow: list[_Clock]) -> tuple[float, float]:
    """Percent saved, by CPU time (reported) and by wall time (logged): best against best."""
    return ((1 - min(c.cpu for c in fast) / min(c.cpu for c in slow)) * 100,
            (1 - min(c.wall for c in fast) / min(c.wall for c in slow)) * 100)


def _ids(session: DecoderSession, n: int, salt: str = "") -> list[int]:
    """``n`` natural-looking token ids (so attention sees text, not noise)."""
    text = salt + _FILLER * (1 + n // 20)
    ids = list(session.tokenizer(text, add_special_tokens=False)["input_ids"])
    while len(ids) < n:
        ids += ids
    return ids[:n]


def _paused_job(session: DecoderSession, context: list[int]) -> Generation:
    """A chat-like job at CONTEXT positions: system prompt, question, answer so far."""
    gen = session.start(prompt_ids=context[:CONTEXT - ANSWERED], max_new_tokens=GEN,
                        ignore_eos=True, static_prefix=SYSTEM)
    for _ in range(ANSWERED):
        session.step(gen)
    return gen


def _speed(session: DecoderSession, context: list[int], reps: int,
           log: Callable[[str], None]) -> dict[str, float]:
    """Wall-time figures, on the session as the runner would configure it."""
    out: dict[str, float] = {}
    gen = session.start(prompt_ids=context, max_new_tokens=4, ignore_eos=True)
    list(session.generate(gen))  # warm: allocations, thread start-up
    prefill = []
    for _ in range(reps + 2):
        gen = session.start(prompt_ids=context, max_new_tokens=1, ignore_eos=True)
        prefill.append(_timed(session.step, gen)[0])
    out["prefill_tokens_per_s"] = CONTEXT / min(prefill)
    decode = []
    for _ in range(reps):
        gen = session.start(prompt_ids=context[:16], max_new_tokens=GEN, ignore_eos=True)
        session.step(gen)
        decode.append(statistics.median(_timed(session.step, gen)[0]
                                        for _ in range(GEN - 1)) * 1e3)
    out["decode_ms_per_token"] = min(decode)
    log(f"prefill {out['prefill_tokens_per_s']:.0f} tokens/s, decode "
        f"{out['decode_ms_per_token']:.2f} ms/token (load average {os.getloadavg()[0]:.1f})")
    snaps, restores, snap_resumes, recomputes = [], [], [], []
    for _ in range(reps):
        gen = _paused_job(session, context)
        t_park, parked = _timed(session.park, gen)
        t_resume, gen = _timed(session.resume, parked)
        snaps.append(t_park)
        restores.append(t_resume)
        parked = session.park(gen)
        snap_resumes.append(_timed(_resume_step, session, parked)[0])
        record = _paused_job(session, context).to_record()
        recomputes.append(_timed(_recompute_step, session, record)[0])
    out["snapshot_ms"] = min(snaps) * 1e3
    out["restore_ms"] = min(restores) * 1e3
    out["snapshot_resume_ms"] = min(snap_resumes) * 1e3
    out["recompute_resume_ms"] = min(recomputes) * 1e3
    log(f"resume: from snapshot {out['snapshot_resume_ms']:.1f} ms, by recompute "
        f"{out['recompute_resume_ms']:.1f} ms (replay "
        f"{'token by token, exact' if session.exact_replay else 'batched'})")
    return out


def _work(session: DecoderSession, context: list[int], reps: int,
          log: Callable[[str], None]) -> dict[str, float]:
    """The three percentages, as CPU-time ratios on a non-spinning session."""
    out: dict[str, float] = {}

    def evict_vs_recompute() -> tuple[float, float]:
        partial, full = [], []
        for _ in range(reps):
            parked = session.park(_paused_job(session, context))
            parked.evict_to_prefix(SYSTEM)
            partial.append(_Clock())
            partial[-1](_resume_step, session, parked)
            record = _paused_job(session, context).to_record()
            session.prefix_cache.clear()  # type: ignore[union-attr]  # a full recompute
            full.append(_Clock())
            full[-1](_recompute_step, session, record)
        return _saving(partial, full)

    out["partial_evict_saving_pct"], wall = evict_vs_recompute()
    log(f"partial eviction saves {out['partial_evict_saving_pct']:.0f}% (wall {wall:.0f}%)")
    if session.exact_replay:  # what batched replay would save (faster, not bit-exact here)
        session._exact_replay = False
        log(f"  with batched replay instead: {evict_vs_recompute()[0]:.0f}%")
        session._exact_replay = True

    out.update(resume_overhead(session, _ids(session, 32, salt="Question: "), reps, log))

    assert session.prefix_cache is not None
    system_ids = context[:SYSTEM]

    def ttft(question: int, cold: bool) -> _Clock:
        if cold:
            session.prefix_cache.clear()  # type: ignore[union-attr]
        ids = system_ids + _ids(session, 32, salt=f"Question {question}: ")
        gen = session.start(prompt_ids=ids, max_new_tokens=1, static_prefix=SYSTEM)
        clock = _Clock()
        clock(lambda: session.step(gen))
        return clock

    ttft(0, cold=True)
    colds, warms = [], []
    for i in range(reps + 2):
        colds.append(ttft(2 * i, cold=True))
        warms.append(ttft(2 * i + 1, cold=False))
    out["prefix_cache_ttft_saving_pct"], wall = _saving(warms, colds)
    log(f"prefix cache saves {out['prefix_cache_ttft_saving_pct']:.0f}% of TTFT (wall {wall:.0f}%)")
    return out


def resume_overhead(session: DecoderSession, prompt: list[int], reps: int,
                    log: Callable[[str], None] = lambda _m: None) -> dict[str, float]:
    """What a resume from a snapshot in memory adds to an uninterrupted generation.

    Not the difference of two noisy totals (that was -4.6 % to +5.9 % across runs):
    the work a resume adds is counted and each piece is timed on its own, many times.
    A GEN-token generation is paused at token GEN / 2 and resumed; against the same
    generation uninterrupted it adds ``park()`` + ``resume()`` (bookkeeping), the
    re-binding of its KV buffer to the session (another job ran in between and bound its
    own), and whatever extra passes or KV copies the counters show (0 and 0 when the
    snapshot is kept in place). The overhead is their time over the generation's time
    (GEN x the median step). ``resume_overhead_noise_pct`` is the spread (max - min) of
    that figure over the repetitions.
    """
    def generation(pause_at: int | None) -> tuple[float, list[float], tuple[int, int, int]]:
        before = (session.passes, session.kv_buffers_made, session.kv_copied_bytes)
        gen = session.start(prompt_ids=prompt, max_new_tokens=GEN, ignore_eos=True)
        steps, extra = [], []
        for i in range(GEN):
            if i == pause_at:
                t = time.perf_counter()
                parked = session.park(gen)
                gen = session.resume(parked)
                extra.append(time.perf_counter() - t)
                t = time.perf_counter()
                _rebind(session, gen)  # the chat that preempted it bound its own buffer
                extra.append(time.perf_counter() - t)
            t = time.perf_counter()
            session.step(gen)
            steps.append(time.perf_counter() - t)
        after = (session.passes, session.kv_buffers_made, session.kv_copied_bytes)
        return sum(extra), steps, tuple(a - b for a, b in zip(after, before))  # type: ignore[return-value]

    figures, extra_work, added_ms, step_ms = [], [], [], []
    for _ in range(reps + 2):
        _, plain_steps, plain_work = generation(None)
        added, steps, work = generation(GEN // 2)
        extra_work.append(tuple(w - p for w, p in zip(work, plain_work)))
        step = statistics.median(plain_steps + steps)
        # An extra pass costs a step; extra copies are inside the timed resume already.
        figures.append((added + extra_work[-1][0] * step) / (GEN * step) * 100)
        added_ms.append(added * 1e3)
        step_ms.append(step * 1e3)
    passes, buffers, copied = max(extra_work)
    out = {"resume_overhead_pct": statistics.median(figures),
           "resume_overhead_noise_pct": max(figures) - min(figures),
           "resume_extra_passes": float(passes), "resume_extra_kv_buffers": float(buffers),
           "resume_copied_bytes": float(copied),
           "resume_added_ms": statistics.median(added_ms),
           "resume_step_ms": statistics.median(step_ms)}
    log(f"resume overhead {out['resume_overhead_pct']:.3f}% (noise "
        f"{out['resume_overhead_noise_pct']:.3f}%): {passes} extra passes, {buffers} extra "
        f"KV buffers, {copied} KV bytes copied")
    return out


def _rebind(session: DecoderSession, gen: Generation) -> None:
    """Bind ``gen``'s KV buffer afresh, as after another job's steps."""
    if getattr(session, "kv_in_place", False) and gen.kv is not None:
        session.release_kv_binding()
        session.bind_kv(gen.kv)


def run_bench(model_dir: Path, *, threads: int = 2, reps: int = 3, replay: str = "auto",
              spinning: bool | None = None,
              log: Callable[[str], None] = lambda _msg: None) -> dict[str, float]:
    """Measure the session on ``model_dir``; returns a map with exactly :data:`BENCH_KEYS`."""
    options: dict[str, Any] = {"threads": threads, "replay": replay}
    if spinning is not None:
        options["spinning"] = spinning
    loads = []
    for _ in range(reps):
        session = DecoderSession.load(model_dir, prefix_cache_bytes=0, **options)
        loads.append(session.load_s)
        if len(loads) < reps:
            session.unload()
    out: dict[str, float] = {"load_s": min(loads)}
    log(f"load {out['load_s']:.2f}s")
    context = _ids(session, CONTEXT)
    out.update(_speed(session, context, reps, log))
    out["kv_bytes_per_token"] = float(session.kv_bytes_per_token)
    session.unload()
    options["spinning"] = False
    out.update(_work(DecoderSession.load(model_dir, **options), context, reps, log))
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {key: round(float(out[key]), 4) for key in BENCH_KEYS}
