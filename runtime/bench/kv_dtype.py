"""What parking KV in fp16 does to the output: greedy agreement with the uninterrupted run.

usage: python -m uniun.runtime.bench.kv_dtype MODEL_DIR [OUT.json]

For each of the peer bench's prompts (chat-templated), a greedy generation of
:data:`TOKENS` tokens runs uninterrupted, then again parked through a
:class:`~uniun.models.parking.ParkingLot` at every :data:`PAUSE_EVERY` tokens (the
worst case: a background job preempted again and again) with ``kv_dtype`` float32 and
float16. Reported per dtype: prompts whose tokens are all the same, and the first token
index where each differs. float32 must give every prompt unchanged (the resume is exact).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["measure", "TOKENS", "PAUSE_EVERY"]

TOKENS = 40
PAUSE_EVERY = 4


def measure(model_dir: Path, threads: int = 2) -> dict[str, Any]:
    from uniun.models.parking import ParkingLot
    from uniun.models.session import DecoderSession
    from uniun.runtime.bench.peer import PROMPTS

    session = DecoderSession.load(model_dir, threads=threads, prefix_cache_bytes=0)
    out: dict[str, Any] = {"model_dir": str(model_dir), "tokens": TOKENS,
                           "pause_every": PAUSE_EVERY, "prompts": len(PROMPTS)}
    plain = []
    for text in PROMPTS:
        gen = session.start(messages=[{"role": "user", "content": text}],
                            max_new_tokens=TOKENS, ignore_eos=True)
        plain.append([e.token_id for e in session.generate(gen)])
    with tempfile.TemporaryDirectory(prefix="uniun-kvdtype-") as tmp:
        for dtype in ("float32", "float16"):
            lot = ParkingLot(1 << 30, spill_dir=Path(tmp), kv_dtype=dtype)
            first_diff, park_s, resumes = [], 0.0, 0
            for text, want in zip(PROMPTS, plain):
                gen = session.start(messages=[{"role": "user", "content": text}],
                                    max_new_tokens=TOKENS, ignore_eos=True, job_id=dtype)
                got = []
                while not gen.finished:
                    got.append(session.step(gen).token_id)
                    if len(got) % PAUSE_EVERY == 0 and not gen.finished:
                        t = time.perf_counter()
                        lot.park(dtype, session.park(gen))
                        gen = session.resume(lot.take(dtype))
                        park_s += time.perf_counter() - t
                        resumes += 1
                diff = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
                first_diff.append(diff)
            out[dtype] = {"same": sum(d is None for d in first_diff),
                          "first_difference": first_diff,
                          "park_and_resume_ms": round(park_s / resumes * 1e3, 3)}
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    result = measure(Path(argv[0]))
    text = json.dumps(result, indent=2)
    if len(argv) > 1:
        Path(argv[1]).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
