"""``uniun-runtime bench --bounded-passes``: runtime/bench/bounded_passes.py, one JSON file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def run_bounded(args: argparse.Namespace) -> int:
    from loguru import logger

    from uniun.runtime.bench.bounded_passes import run

    logger.remove()  # the in-process session logs at DEBUG; keep the console readable
    logger.add(sys.stderr, level="WARNING")
    if args.reps < 1 or args.prompt_tokens < 2 or args.snapshot_tokens < 2:
        print("uniun-runtime: bench --bounded-passes needs --reps >= 1, --prompt-tokens >= 2 "
              "and --snapshot-tokens >= 2", file=sys.stderr)
        return 2
    out = args.out or Path("bench/results") / f"bounded-passes-{args.model}.json"
    try:
        result = run(model=args.model, reps=args.reps, prompt_tokens=args.prompt_tokens,
                     snapshot_tokens=args.snapshot_tokens, home=args.home,
                     log=lambda msg: print(msg, file=sys.stderr))
    except RuntimeError as err:
        print(f"uniun-runtime: bench --bounded-passes failed: {err}", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    summary = {name: r["ratios"] for name, r in result["runtimes"].items()}
    summary["prefill_bounded_over_unbounded"] = result.get("prefill", {}).get(
        "bounded_over_unbounded")
    summary["recompute_over_resume"] = result.get("snapshot", {}).get(
        "recompute_over_resume_memory")
    print(json.dumps(summary, indent=2))
    print(f"(written to {out})", file=sys.stderr)
    return 0
