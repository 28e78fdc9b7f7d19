"""In-process half of ``bench --bounded-passes``: what the bound costs, and what parking saves.

- ``prefill``: a long prompt (``prompt_tokens``, ~1,700) to its first token, three ways,
  interleaved per repetition: in one pass (``unbounded``), in passes of 64 positions
  (``fixed_64``: passes fixed in tokens) and in passes sized as the runner sizes them
  (``bounded``: ~``target_ms`` each from the measured costs, longer where a pass's
  overhead nears that, at most ``prefill_chunk_max``). Per way: seconds to the first
  token, passes, the longest pass. The longest pass is what an abort throws away (and
  what a chat arriving mid-prefill would wait for without one);
  ``bounded / unbounded`` seconds is the bound's cost to background throughput.
- ``decode_step_s``: one decode step at that context (a chat arriving mid-step waits up
  to this without an abort).
- ``abort``: a 64-position prompt pass near the end of that prompt, and a decode step
  there, each interrupted from another thread a third of the way in: seconds from the
  interrupt to the pass's return (what a chat waits for the pass in flight).
- ``snapshot``: a ``snapshot_tokens`` (2,000) job parked after its first token (by
  reference: free), then to its next token: resumed from memory, compacted as the parking
  does under pressure, spilled to disk and read back, and recomputed from its progress
  alone; the bytes of each form and whether every way gave the same next token.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniun.actors.runner.pacing import PASS_FLOOR, PASS_TARGET_S, PREFILL_CHUNK
from uniun.models.decoder_model import Interrupted
from uniun.models.generate import Generation
from uniun.models.kv import JobProgress, ParkedState
from uniun.models.pass_budget import PassCost, pass_positions
from uniun.models.session import DecoderSession

Log = Callable[[str], None]
FILLER = ("The lighthouse keeper wrote down the weather, the ships that passed and the "
          "colour of the sea at dawn, noon and dusk, every day of the long winter. ")


def long_text(tokenizer: Any, tokens: int) -> str:
    """Plain text of at least ``tokens`` tokens for this tokenizer."""
    per = max(1, len(tokenizer(FILLER, add_special_tokens=False)["input_ids"]))
    repeats = tokens // per + 1
    while len(tokenizer(FILLER * repeats, add_special_tokens=False)["input_ids"]) < tokens:
        repeats += max(1, repeats // 20)
    return FILLER * repeats


def prompt_ids(session: DecoderSession, tokens: int) -> list[int]:
    text = long_text(session.tokenizer, tokens)
    return list(session.tokenizer(text, add_special_tokens=False)["input_ids"])[:tokens]


def _to_first_token(session: DecoderSession, ids: list[int], chunk: Callable[[], int] | None,
                    cost: PassCost | None, steps: int = 0) -> dict[str, float]:
    """Prefill ``ids`` to the first token (passes of ``chunk()``, or one), then ``steps``
    decode steps; each timed pass is told to ``cost`` as the runner tells its own."""
    gen = session.start(prompt_ids=ids, max_new_tokens=steps + 2, use_prefix_cache=False)
    t0 = time.perf_counter()
    passes, longest = 0, 0.0
    while True:
        covered, t1 = gen.kv_length, time.perf_counter()
        ev = session.step(gen) if chunk is None else session.advance(gen, chunk())
        seconds = time.perf_counter() - t1
        passes += 1
        longest = max(longest, seconds)
        if ev is not None:
            break
        if cost is not None:
            cost.observe(gen.kv_length - covered, seconds)
    total = time.perf_counter() - t0
    for _ in range(steps):
        t1 = time.perf_counter()
        session.step(gen)
        if cost is not None:
            cost.observe_step(time.perf_counter() - t1)
    return {"s": total, "passes": passes, "longest_pass_s": longest}


def measure_prefill(session: DecoderSession, *, prompt_tokens: int, reps: int,
                    target_ms: float, chunk_max: int, log: Log) -> dict[str, Any]:
    ids = prompt_ids(session, prompt_tokens)
    cost = PassCost()
    _to_first_token(session, ids[:64], lambda: PASS_FLOOR, cost, steps=2)  # first costs

    def bounded() -> int:
        return pass_positions(cost.per_position_s, overhead_s=cost.overhead_s,
                              target_s=target_ms / 1000, floor=PASS_FLOOR, ceiling=chunk_max)

    ways: dict[str, tuple[Callable[[], int] | None, PassCost | None]] = {
        "unbounded": (None, None), "fixed_64": (lambda: 64, None), "bounded": (bounded, cost)}
    runs: dict[str, list[dict[str, float]]] = {w: [] for w in ways}
    for rep in range(reps):
        for way, (chunk, learn) in ways.items():
            runs[way].append(_to_first_token(session, ids, chunk, learn, steps=2))
        log(f"  prefill rep {rep + 1}: " + ", ".join(
            f"{w} {runs[w][-1]['s']:.2f} s (longest pass {runs[w][-1]['longest_pass_s']:.3f})"
            for w in ways))
    out: dict[str, Any] = {"prompt_tokens": len(ids), "target_ms": target_ms,
                           "prefill_chunk_max": chunk_max}
    for way, samples in runs.items():
        out[way] = {"s_p50": statistics.median(r["s"] for r in samples),
                    "passes": samples[-1]["passes"],
                    "longest_pass_s_p50": statistics.median(r["longest_pass_s"] for r in samples),
                    "samples_s": [r["s"] for r in samples]}
    out["bounded_over_unbounded"] = out["bounded"]["s_p50"] / out["unbounded"]["s_p50"]
    out["fixed_64_over_unbounded"] = out["fixed_64"]["s_p50"] / out["unbounded"]["s_p50"]
    gen = session.start(prompt_ids=ids, max_new_tokens=20, use_prefix_cache=False)
    session.step(gen)
    t0 = time.perf_counter()
    for _ in range(16):
        session.step(gen)
    out["decode_step_s"] = (time.perf_counter() - t0) / 16
    return out


def measure_abort(session: DecoderSession, *, prompt_tokens: int, reps: int, log: Log
                  ) -> dict[str, Any]:
    """How soon an interrupt ends a pass in flight: 64-position prompt passes near the end
    of a long prompt, and decode steps after it; each rep times one pass whole, then
    interrupts the next from another thread a third of the way in (by the whole one's
    time) and takes the seconds from the interrupt to that pass's return."""
    ids = prompt_ids(session, prompt_tokens)
    start = max(2, len(ids) - 1 - 128 * reps)  # room for 2 passes of 64 per rep
    out: dict[str, Any] = {}
    for kind in ("prefill_pass", "decode_step"):
        gen = session.start(prompt_ids=ids, max_new_tokens=2 * reps + 2,
                            use_prefix_cache=False)
        while gen.kv_length < start:
            session.prefill(gen, min(64, start - gen.kv_length), max_passes=1)

        def one_pass(gen: Generation = gen, kind: str = kind) -> None:
            if kind == "prefill_pass":
                session.prefill(gen, 64, max_passes=1)
            else:
                session.step(gen)
        if kind == "decode_step":
            one_pass()  # the rest of the prompt and the first token
        whole: list[float] = []
        waits: list[float] = []
        for _ in range(reps):
            t0 = time.perf_counter()
            one_pass()
            whole.append(time.perf_counter() - t0)
            fired: list[float] = []

            def fire(fired: list[float] = fired) -> None:
                fired.append(time.perf_counter())
                session.interrupt()
            timer = threading.Timer(whole[-1] / 3, fire)
            timer.start()
            try:
                one_pass()
            except Interrupted:
                waits.append(time.perf_counter() - fired[0])
            timer.join()
            session.clear_interrupt()  # one that came after a pass ended: not for later
        out[kind] = {"pass_s_p50": statistics.median(whole), "aborted": len(waits),
                     "interrupt_to_return_s_p50": statistics.median(waits) if waits else None}
        log(f"  abort of a {kind}: whole {out[kind]['pass_s_p50']:.3f} s, interrupt -> "
            f"return {out[kind]['interrupt_to_return_s_p50']} s ({len(waits)}/{reps})")
    return out


def _parked_after_first_token(session: DecoderSession, ids: list[int]) -> tuple[ParkedState, int]:
    gen = session.start(prompt_ids=ids, max_new_tokens=4, use_prefix_cache=False)
    session.step(gen)
    return session.park(gen), gen.progress.total_tokens


def _timed_next(session: DecoderSession, make: Callable[[], Any]) -> tuple[float, int]:
    t0 = time.perf_counter()
    gen = make()
    token = session.step(gen).token_id
    return time.perf_counter() - t0, token


def measure_snapshot(session: DecoderSession, *, tokens: int, reps: int, log: Log
                     ) -> dict[str, Any]:
    ids = prompt_ids(session, tokens)
    samples: dict[str, list[float]] = {k: [] for k in (
        "compact_s", "resume_memory_s", "spill_s", "resume_spill_s", "recompute_s")}
    sizes: dict[str, int] = {}
    same = True
    with tempfile.TemporaryDirectory(prefix="uniun-bench-spill-") as folder:
        for rep in range(reps):
            parked, _ = _parked_after_first_token(session, ids)  # by reference: no cost
            progress = JobProgress.from_record(parked.progress.to_record())
            kv = parked.kv
            assert kv is not None
            sizes["buffer_bytes"] = kv.nbytes
            t0 = time.perf_counter()
            compact = kv.compact()
            samples["compact_s"].append(time.perf_counter() - t0)
            sizes["compact_bytes"] = compact.nbytes
            s, token_memory = _timed_next(session, lambda: session.resume(parked))  # noqa: B023
            samples["resume_memory_s"].append(s)
            state = ParkedState(JobProgress.from_record(progress.to_record()), compact)
            path = Path(folder) / f"rep{rep}.kvsnap"
            t0 = time.perf_counter()
            state.spill(path)
            samples["spill_s"].append(time.perf_counter() - t0)
            sizes["spill_file_bytes"] = path.stat().st_size
            s, token_spill = _timed_next(
                session, lambda: session.resume(ParkedState.load(path)))  # noqa: B023
            samples["resume_spill_s"].append(s)
            s, token_recompute = _timed_next(session, lambda: session.recompute(progress))  # noqa: B023
            samples["recompute_s"].append(s)
            same = same and token_memory == token_spill == token_recompute
            log(f"  snapshot rep {rep + 1}: resume {samples['resume_memory_s'][-1]:.3f} s, "
                f"spill {samples['spill_s'][-1]:.3f} + resume {samples['resume_spill_s'][-1]:.3f}"
                f" s, recompute {samples['recompute_s'][-1]:.3f} s")
    out: dict[str, Any] = {"tokens": len(ids) + 1, "same_next_token": same, **sizes,
                           "kv_bytes_per_token": session.kv_bytes_per_token}
    for key, values in samples.items():
        out[key + "_p50"] = statistics.median(values)
    out["recompute_over_resume_memory"] = out["recompute_s_p50"] / out["resume_memory_s_p50"]
    out["recompute_over_spill_and_resume"] = out["recompute_s_p50"] / (
        out["spill_s_p50"] + out["resume_spill_s_p50"])
    return out


def run(model_dir: Path, *, prompt_tokens: int = 1700, snapshot_tokens: int = 2000,
        reps: int = 3, threads: int = 2, target_ms: float = PASS_TARGET_S * 1000,
        chunk_max: int = PREFILL_CHUNK, log: Log = lambda _m: None) -> dict[str, Any]:
    """Both measures on a session of ``model_dir`` loaded here."""
    session = DecoderSession.load(model_dir, threads=threads)
    log(f"in process: prefill of {prompt_tokens} tokens, three ways")
    prefill = measure_prefill(session, prompt_tokens=prompt_tokens, reps=reps,
                              target_ms=target_ms, chunk_max=chunk_max, log=log)
    log("in process: an interrupt during a prefill pass and a decode step")
    abort = measure_abort(session, prompt_tokens=prompt_tokens, reps=reps, log=log)
    log(f"in process: a {snapshot_tokens}-token snapshot: park, spill, resume, recompute")
    snapshot = measure_snapshot(session, tokens=snapshot_tokens, reps=reps, log=log)
    session.unload()
    return {"prefill": prefill, "abort": abort, "snapshot": snapshot}
