"""``uniun-runtime bench-swaps``: the multi-model trace on the real mesh (``bench/swaps.py``).

Apart from ``bench`` because it needs a second real model (``models pull gemma3-270m``)
and a few minutes per policy; it writes one JSON file and prints one line per policy.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from uniun.runtime.config import DEFAULT_CHAT_MODEL

DEFAULT_OUT = Path("bench/results") / "swaps-multi-model.json"


def register(sub: argparse._SubParsersAction) -> None:
    from uniun.runtime.bench.swaps import DEFAULT_MAP, DEFAULT_TRACE

    parser = sub.add_parser(
        "bench-swaps", help="replay the multi-model trace on real models: swaps, swap time, "
                            "chat TTFT when the chat model is not loaded (uniun vs fcfs)",
        description="Replay the first --window seconds of a trace (default the shipped "
                    "multi_model.jsonl) against a real runtime per policy, with the trace's "
                    "other models mapped onto real ones (--map). Writes JSON (default "
                    f"{DEFAULT_OUT}).")
    parser.add_argument("--model", default=DEFAULT_CHAT_MODEL,
                        help=f"the chat model (default {DEFAULT_CHAT_MODEL})")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--map", action="append", default=[], metavar="TRACE_ID=MODEL_ID",
                        help="model of the trace -> installed model (default: "
                             + ", ".join(f"{k}={v}" for k, v in DEFAULT_MAP.items()) + ")")
    parser.add_argument("--window", type=float, default=240.0,
                        help="seconds of the trace to replay (default 240)")
    parser.add_argument("--token-scale", type=float, default=0.25,
                        help="factor on prompt and new tokens (default 0.25)")
    parser.add_argument("--drain", type=float, default=240.0,
                        help="seconds to wait for submitted jobs after the window (default 240)")
    parser.add_argument("--policies", default="uniun,fcfs")
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from uniun.runtime.bench.swaps import DEFAULT_MAP, run as run_swaps

    mapping = dict(DEFAULT_MAP)
    for item in args.map:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            print(f"uniun-runtime: --map needs TRACE_ID=MODEL_ID (got {item!r})", file=sys.stderr)
            return 2
        mapping[key] = value
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    if not policies or any(p not in ("uniun", "fcfs") for p in policies) \
            or args.window <= 0 or args.token_scale <= 0:
        print("uniun-runtime: bench-swaps needs --policies from uniun,fcfs, --window > 0 "
              "and --token-scale > 0", file=sys.stderr)
        return 2
    from uniun.runtime.commands.common import unknown_model

    for model in (args.model, *mapping.values()):
        problem = unknown_model(model)
        if problem is not None:
            print(f"uniun-runtime: bench-swaps: {problem}", file=sys.stderr)
            return 2
    home = args.home or Path(tempfile.mkdtemp(prefix="uniun-bench-swaps-", dir="/tmp"))
    try:
        result = run_swaps(chat_model=args.model, policies=policies, trace=args.trace,
                           window_s=args.window, token_scale=args.token_scale,
                           drain_s=args.drain, home=home, model_map=mapping,
                           log=lambda msg: print(msg, file=sys.stderr))
    except RuntimeError as err:
        print(f"uniun-runtime: bench-swaps failed: {err}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({p: {k: r[k] for k in ("swaps", "swap_seconds_total", "chat_ttft_cold_s")}
                      for p, r in result["policies"].items()}))
    print(f"(written to {args.out})", file=sys.stderr)
    return 0
