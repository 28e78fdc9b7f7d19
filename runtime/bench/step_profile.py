"""Where one decode step's time goes: onnxruntime's node profile, summed per op type.

usage: python -m uniun.runtime.bench.step_profile MODEL_DIR [THREADS] [OUT.json]

Loads the decoder session with onnxruntime profiling on, prefills a 64-token prompt,
runs :data:`STEPS` greedy decode steps, and sums the ``Node`` events of those steps (the
prefill and warm-up passes are left out) by op type. The result: each op type's share of
the node time and its microseconds per step, plus the wall milliseconds per step seen
from Python (the difference is session overhead: binding, allocation, Python).
Profiling adds overhead of its own, so compare shares, not absolute times.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = ["profile_step", "STEPS"]

STEPS = 32


def _node_times(trace: list[dict[str, Any]], passes_to_skip: int) -> dict[str, float]:
    """Microseconds per op type over the passes after the first ``passes_to_skip``."""
    runs = sorted(e["ts"] for e in trace if e.get("cat") == "Session"
                  and e.get("name") == "model_run")
    cutoff = runs[passes_to_skip] if len(runs) > passes_to_skip else 0
    per_op: dict[str, float] = defaultdict(float)
    for e in trace:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") \
                and e["ts"] >= cutoff:
            per_op[e.get("args", {}).get("op_name", "?")] += float(e["dur"])
    return dict(per_op)


def profile_step(model_dir: Path, threads: int = 2) -> dict[str, Any]:
    """The per-op profile of :data:`STEPS` decode steps (see the module doc)."""
    from uniun.models.session import DecoderSession

    with tempfile.TemporaryDirectory(prefix="uniun-prof-") as tmp:
        session = DecoderSession.load(model_dir, threads=threads, prefix_cache_bytes=0,
                                      profile_prefix=str(Path(tmp) / "step"))
        ids = list(session.tokenizer("The quick brown fox jumps over the lazy dog. " * 8,
                                     add_special_tokens=False)["input_ids"])[:64]
        gen = session.start(prompt_ids=ids, max_new_tokens=STEPS + 8, ignore_eos=True)
        for _ in range(4):  # prefill + 3 warm steps
            session.step(gen)
        skip = session.passes
        t = time.perf_counter()
        for _ in range(STEPS):
            session.step(gen)
        wall_ms = (time.perf_counter() - t) / STEPS * 1e3
        trace_path = session._sess.end_profiling()  # a dev tool may reach into the session
        trace = json.loads(Path(trace_path).read_text())
    per_op = _node_times(trace, skip)
    total = sum(per_op.values())
    rows = sorted(per_op.items(), key=lambda kv: -kv[1])
    return {"model_dir": str(model_dir), "threads": threads, "steps": STEPS,
            "kv_in_place": session.kv_in_place, "wall_ms_per_step": round(wall_ms, 3),
            "node_ms_per_step": round(total / STEPS / 1e3, 3),
            "ops": [{"op": op, "share": round(us / total, 4),
                     "us_per_step": round(us / STEPS, 1)} for op, us in rows]}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    result = profile_step(Path(argv[0]), int(argv[1]) if len(argv) > 1 else 2)
    text = json.dumps(result, indent=2)
    if len(argv) > 2:
        Path(argv[2]).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
