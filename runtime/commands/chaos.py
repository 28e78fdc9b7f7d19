"""``uniun-runtime chaos``: kill the runtime's processes under load, then judge.

The harness is :mod:`uniun.runtime.chaos` (workload, faults, verdict); this module is
its command line. Exit code 0 when the verdict passes, 1 when it fails, 2 when the run
could not be made (no runtime, a calibration job that failed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from uniun.runtime.chaos.harness import ChaosOptions, run_chaos
from uniun.runtime.chaos.verdict import render
from uniun.runtime.chaos.workload import WorkloadSettings


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "chaos", help="fault injection under load, with a Jepsen-style verdict",
        description="Run a mixed workload (chats, extract/nataraj/gana jobs, embedding "
                    "requests) against a runtime while injecting seeded faults: SIGKILL of "
                    "the runner, the scheduler, each producer, the embedding pool and its "
                    "workers, the background-Gana process; SIGSTOP/SIGCONT; a client that "
                    "disconnects mid-stream. Then report acknowledged, completed, lost, "
                    "duplicated and unexpected jobs, texts that differ from a fault-free "
                    "run of the same greedy jobs, token-stream gaps, and recovery times "
                    "per kind of fault. Starts a runtime of its own in a temporary home "
                    "unless --home names a running one (whose restart limit the kills "
                    "count against).")
    parser.add_argument("--kills", type=int, default=10, metavar="N",
                        help="faults to inject (default 10)")
    parser.add_argument("--duration", type=float, default=None, metavar="S",
                        help="seconds the fault phase should take (default 8 s per fault)")
    parser.add_argument("--seed", type=int, default=1, metavar="K", help="seed (default 1)")
    parser.add_argument("--home", type=Path, default=None,
                        help="chaos against the running runtime of this UNIUN_HOME "
                             "(default: start one of its own in a temporary home)")
    parser.add_argument("--model", default="tiny-1",
                        help="chat model of its own runtime (default tiny-1: fast, greedy, "
                             "deterministic)")
    parser.add_argument("--background", type=int, default=3,
                        help="background jobs kept in flight (default 3)")
    parser.add_argument("--bg-tokens", type=int, default=300,
                        help="max_new_tokens of a background job (default 300)")
    parser.add_argument("--kinds", default="",
                        help="comma-separated fault kinds to draw from, e.g. "
                             "kill:runner,kill:scheduler,stop:runner,disconnect (default: "
                             "every kind the runtime's processes allow)")
    parser.add_argument("--processes", default="",
                        help="its own runtime runs only these processes, e.g. "
                             "scheduler,runner (default: every one)")
    parser.add_argument("--no-embeds", action="store_true",
                        help="no embedding requests (and no embedding reference)")
    parser.add_argument("--fuzz-frames", type=int, default=0, metavar="N",
                        help="after the faults, N hostile frames from the wire fuzzer "
                             "(runtime/chaos/fuzz.py; skipped if absent)")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the verdict JSON to this file")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.kills < 0 or args.background < 1 or args.bg_tokens < 1:
        print("uniun-runtime chaos: --kills must be >= 0, --background and --bg-tokens "
              ">= 1", file=sys.stderr)
        return 2
    opts = ChaosOptions(
        kills=args.kills, seed=args.seed, home=args.home, model=args.model,
        duration_s=args.duration if args.duration is not None else 8.0 * args.kills,
        workload=WorkloadSettings(background=args.background, bg_tokens=args.bg_tokens),
        embeds=not args.no_embeds, fuzz_frames=args.fuzz_frames,
        kinds=tuple(k.strip() for k in args.kinds.split(",") if k.strip()),
        children=tuple(p.strip() for p in args.processes.split(",") if p.strip()))

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        verdict = run_chaos(opts, log)
    except (RuntimeError, ConnectionError, TimeoutError) as err:
        print(f"uniun-runtime chaos: {err}", file=sys.stderr)
        return 2
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(verdict, indent=2) + "\n")
    print(json.dumps(verdict, indent=2) if args.json else render(verdict))
    return 0 if verdict["ok"] else 1
