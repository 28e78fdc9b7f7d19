"""``models bench``: what the decoder session costs on this machine, in numbers.

Other processes share the two cores, so single timings are noisy and mostly *too slow*:
each time below is the best of a few repetitions (the run least disturbed by others,
closest to this code's own cost), and each ratio compares best against best. The keys of :func:`run_bench`'s result are the
contract of issue 3 (``--json`` prints exactly these):

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
* ``resume_overhead_pct`` — active time of a 128-token generation paused once at token 64
  and resumed from its snapshot, against the same generation uninterrupted
  (time spent parked is not counted; noise can make it slightly negative).
* ``partial_evict_saving_pct`` — resume of that job after trimming it to its 192-token
  system prompt, against a full recompute of its 256 positions.
* ``prefix_cache_ttft_saving_pct`` — time to first token of a job with a 192-token system
  prompt and a 32-token question, prefix cache hit vs. cold.
* ``peak_rss_mb`` — the process's peak resident memory (``ru_maxrss``).
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniun.models.session import DecoderSession

__all__ = ["BENCH_KEYS", "run_bench"]

BENCH_KEYS = ("load_s", "prefill_tokens_per_s", "decode_ms_per_token", "kv_bytes_per_token",
              "snapshot_ms", "restore_ms", "snapshot_resume_ms", "recompute_resume_ms",
              "resume_overhead_pct", "partial_evict_saving_pct", "prefix_cache_ttft_saving_pct",
              "peak_rss_mb")

CONTEXT = 256  # positions of the paused job
SYSTEM = 192  # static prefix kept by partial eviction / shared through the prefix cache
GEN = 128  # tokens of the resume-overhead generation
ANSWERED = 32  # tokens a paused job has generated (192 system + 32 question + 32 answer)

_FILLER = (
    "You are a careful assistant that runs on a small device. Answer briefly and "
    "truthfully; say when you do not know. The user keeps notes about meetings, books, "
    "travel plans and recipes, and asks questions about them during the day. "
)


def _ids(session: DecoderSession, n: int, salt: str = "") -> list[int]:
    """``n`` natural-looking token ids (so attention sees text, not noise)."""
    text = salt + _FILLER * (1 + n // 20)
    ids = list(session.tokenizer(text, add_special_tokens=False)["input_ids"])
    while len(ids) < n:
        ids += ids
    return ids[:n]


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _best(fn: Callable[[], float], reps: int) -> float:
    return min(fn() for _ in range(reps))


def run_bench(model_dir: Path, *, threads: int = 2, reps: int = 3, replay: str = "auto",
              spinning: bool | None = None,
              log: Callable[[str], None] = lambda _msg: None) -> dict[str, float]:
    """Measure the session on ``model_dir``; returns a map with exactly :data:`BENCH_KEYS`."""
    options = {} if spinning is None else {"spinning": spinning}
    loads = []
    for _ in range(reps):
        session = DecoderSession.load(model_dir, threads=threads, prefix_cache_bytes=0,
                                      replay=replay, **options)
        loads.append(session.load_s)
        if len(loads) < reps:
            session.unload()
    out: dict[str, float] = {"load_s": min(loads)}
    log(f"load {out['load_s']:.2f}s")
    context = _ids(session, CONTEXT)

    def warm() -> None:  # first runs pay for allocations and thread start-up
        gen = session.start(prompt_ids=context, max_new_tokens=4, ignore_eos=True)
        list(session.generate(gen))

    warm()
    log(f"replay {'token by token (exact)' if session.exact_replay else 'batched'}")

    def prefill() -> float:
        gen = session.start(prompt_ids=context, max_new_tokens=1, ignore_eos=True)
        return _timed(lambda: session.step(gen))[0]

    out["prefill_tokens_per_s"] = CONTEXT / _best(prefill, reps + 2)
    log(f"prefill {out['prefill_tokens_per_s']:.0f} tokens/s")

    def decode() -> float:
        gen = session.start(prompt_ids=context[:16], max_new_tokens=GEN, ignore_eos=True)
        session.step(gen)
        steps = [_timed(lambda: session.step(gen))[0] for _ in range(GEN - 1)]
        return statistics.median(steps) * 1e3

    out["decode_ms_per_token"] = _best(decode, reps)
    log(f"decode {out['decode_ms_per_token']:.2f} ms/token")
    out["kv_bytes_per_token"] = float(session.kv_bytes_per_token)

    def paused_job() -> Any:
        """A chat-like job paused at CONTEXT positions: system prompt, question, answer so far."""
        gen = session.start(prompt_ids=context[:CONTEXT - ANSWERED], max_new_tokens=GEN,
                            ignore_eos=True, static_prefix=SYSTEM)
        for _ in range(ANSWERED):
            session.step(gen)
        return gen

    snaps, restores, snap_resumes, recomputes, partials = [], [], [], [], []
    for _ in range(reps):
        gen = paused_job()
        t_park, parked = _timed(lambda: session.park(gen))
        t_resume, gen2 = _timed(lambda: session.resume(parked))
        snaps.append(t_park)
        restores.append(t_resume)
        parked = session.park(gen2)
        snap_resumes.append(_timed(lambda: session.step(session.resume(parked)))[0])
        record = paused_job().to_record()
        recomputes.append(_timed(lambda: session.step(session.recompute(record)))[0])
        gen = paused_job()
        parked = session.park(gen)
        parked.evict_to_prefix(SYSTEM)
        partials.append(_timed(lambda: session.step(session.resume(parked)))[0])
    out["snapshot_ms"] = min(snaps) * 1e3
    out["restore_ms"] = min(restores) * 1e3
    out["snapshot_resume_ms"] = min(snap_resumes) * 1e3
    out["recompute_resume_ms"] = min(recomputes) * 1e3
    out["partial_evict_saving_pct"] = (1 - min(partials) / min(recomputes)) * 100
    log(f"resume: snapshot {out['snapshot_resume_ms']:.1f} ms, recompute "
        f"{out['recompute_resume_ms']:.1f} ms, partial saves {out['partial_evict_saving_pct']:.0f}%")

    prompt = _ids(session, 32, salt="Question: ")

    def generation(pause_at: int | None) -> float:
        gen = session.start(prompt_ids=prompt, max_new_tokens=GEN, ignore_eos=True)
        active = 0.0
        for i in range(GEN):
            if i == pause_at:
                t, parked = _timed(lambda: session.park(gen))
                t2, gen = _timed(lambda: session.resume(parked))
                active += t + t2
            active += _timed(lambda: session.step(gen))[0]
        return active

    plain, paused = [], []
    for _ in range(reps):  # interleaved, so drifting load hits both alike
        plain.append(generation(None))
        paused.append(generation(GEN // 2))
    out["resume_overhead_pct"] = (min(paused) / min(plain) - 1) * 100
    log(f"resume overhead {out['resume_overhead_pct']:.1f}%")

    cached = DecoderSession.load(model_dir, threads=threads, replay=replay, **options)
    system_ids = context[:SYSTEM]

    def ttft(question: int, cold: bool) -> float:
        if cold:
            cached.prefix_cache.clear()  # type: ignore[union-attr]
        ids = system_ids + _ids(cached, 32, salt=f"Question {question}: ")
        gen = cached.start(prompt_ids=ids, max_new_tokens=1, static_prefix=SYSTEM)
        return _timed(lambda: cached.step(gen))[0]

    ttft(0, cold=True)
    colds, warms = [], []
    for i in range(reps + 2):
        colds.append(ttft(2 * i, cold=True))
        warms.append(ttft(2 * i + 1, cold=False))
    out["prefix_cache_ttft_saving_pct"] = (1 - min(warms) / min(colds)) * 100
    log(f"prefix cache saves {out['prefix_cache_ttft_saving_pct']:.0f}% of TTFT")
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {key: round(float(out[key]), 4) for key in BENCH_KEYS}
