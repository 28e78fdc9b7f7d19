"""What decoding several sequences per pass buys: tokens/s, a chat's step, ``n`` samples.

usage: python -m uniun.runtime.bench.batch_decode MODEL_ID [THREADS] [--out OUT.json]

MODEL_ID is looked up in the model store (``$UNIUN_MODELS``). Measured with
:class:`~uniun.models.batch.DecodeBatch`, greedy, EOS ignored:

* ``decode``: per batch size B (1 to 4, then 8), :data:`STEPS` decode steps of B
  sequences with :data:`PROMPT_TOKENS`-token prompts already prefilled: ms per step,
  aggregate tokens/s, and ``throughput_x`` (B's tokens/s over B=1's); the median of
  :data:`ROUNDS` rounds, each round measuring every size in turn. ``cpu_ms_per_step`` and
  ``cpu_throughput_x`` are the same in the process's CPU time, which the neighbours of a
  loaded machine move less than wall time (spinning pool threads count in it too). A chat sharing a
  batch with B-1 background sequences waits one such step per token, so ``step_x`` (B's
  step time over B=1's) is that chat's time per token against decoding alone.
* ``n``: ``n`` samples of one prompt (``DecodeBatch.join_group``: one prefill, the KV
  copied per row, a seed each) for :data:`N_TOKENS` tokens each, wall time from start to
  the last token, for n = 1 and 8 (``wall_x``: n=8 over n=1), in the same rounds.

Run it on a quiet machine for figures to compare; the result says the load it saw.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["measure", "STEPS", "ROUNDS", "PROMPT_TOKENS", "N_TOKENS"]

STEPS = 24  # decode steps per batch size and round
ROUNDS = 3
PROMPT_TOKENS = 64
N_TOKENS = 32
SIZES = (1, 2, 3, 4, 8)


def _prompt(session: Any, salt: int) -> list[int]:
    text = f"Story {salt}: the quick brown fox jumps over the lazy dog. " * 12
    return list(session.tokenizer(text, add_special_tokens=False)["input_ids"])[:PROMPT_TOKENS]


def _ready_batch(session: Any, size: int) -> Any:
    """A batch of ``size`` sequences, prompts fed and a first batched step taken."""
    from uniun.models.batch import DecodeBatch

    batch = DecodeBatch(session, size=size, prefill_chunk=PROMPT_TOKENS)
    for i in range(size):
        batch.join(session.start(prompt_ids=_prompt(session, i),
                                 max_new_tokens=ROUNDS * STEPS + 8, ignore_eos=True))
    while any(len(g.pending_ids()) > 1 or not g.generated_ids for g in batch.members):
        batch.step()
    batch.step()
    return batch


def _n_samples(session: Any, n: int) -> float:
    """Seconds from start to the last of ``n`` samples' :data:`N_TOKENS` tokens."""
    from uniun.models.batch import DecodeBatch

    batch = DecodeBatch(session, size=n, prefill_chunk=PROMPT_TOKENS)
    t = time.perf_counter()
    gens = [session.start(prompt_ids=_prompt(session, 99), max_new_tokens=N_TOKENS,
                          ignore_eos=True, sampling={"temperature": 0.8, "seed": 1000 + i})
            for i in range(n)]
    batch.join_group(gens)
    while len(batch):
        batch.step()
    return time.perf_counter() - t


def measure(model_dir: Path, threads: int = 2) -> dict[str, Any]:
    """Every figure is the median of :data:`ROUNDS` rounds, and each round measures every
    batch size (and n) in turn, so a change of load hits them alike."""
    from uniun.models.session import DecoderSession

    session = DecoderSession.load(model_dir, threads=threads, prefix_cache_bytes=0)
    load0 = os.getloadavg()[0]
    batches = {size: _ready_batch(session, size) for size in SIZES}
    step_s: dict[int, list[float]] = {size: [] for size in SIZES}
    cpu_s: dict[int, list[float]] = {size: [] for size in SIZES}
    n_s: dict[int, list[float]] = {1: [], 8: []}
    for _ in range(ROUNDS):
        for size, batch in batches.items():
            t, c = time.perf_counter(), time.process_time()
            for _ in range(STEPS):
                batch.step()
            step_s[size].append((time.perf_counter() - t) / STEPS)
            cpu_s[size].append((time.process_time() - c) / STEPS)
        for n in n_s:
            n_s[n].append(_n_samples(session, n))
    one, cpu_one = statistics.median(step_s[1]), statistics.median(cpu_s[1])
    decode = []
    for size in SIZES:
        ms, cpu = statistics.median(step_s[size]), statistics.median(cpu_s[size])
        decode.append({"batch": size, "ms_per_step": round(ms * 1e3, 2),
                       "tokens_per_s": round(size / ms, 1),
                       "throughput_x": round(size * one / ms, 2), "step_x": round(ms / one, 2),
                       "cpu_ms_per_step": round(cpu * 1e3, 2),
                       "cpu_throughput_x": round(size * cpu_one / cpu, 2)})
    n1, n8 = statistics.median(n_s[1]), statistics.median(n_s[8])
    return {"model": session.model_id, "threads": session.threads, "steps": STEPS,
            "rounds": ROUNDS, "prompt_tokens": PROMPT_TOKENS, "decode": decode,
            "n_samples": {"tokens_each": N_TOKENS, "n1_wall_s": round(n1, 3),
                          "n8_wall_s": round(n8, 3), "wall_x": round(n8 / n1, 2)},
            "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "cpus": os.cpu_count()}


def main(argv: list[str]) -> int:
    from uniun.models.store import ModelStore
    from uniun.runtime.paths import models_dir

    parser = argparse.ArgumentParser(prog="python -m uniun.runtime.bench.batch_decode")
    parser.add_argument("model_id")
    parser.add_argument("threads", nargs="?", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None,
                        help="default: bench/results/batch-decode-MODEL_ID.json")
    args = parser.parse_args(argv)
    folder = ModelStore(models_dir()).path(args.model_id)
    result = measure(folder, args.threads)
    text = json.dumps(result, indent=2)
    out = args.out or Path("bench/results") / f"batch-decode-{args.model_id}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
