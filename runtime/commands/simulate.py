"""``uniun-runtime simulate TRACE.jsonl``: replay a workload trace against a policy.

No model, no processes: the scheduling policy is driven by a simulated runner with a
cost model (``uniun.actors.sim.simulator``), so a policy's value can be shown and its
defaults tuned in seconds. A bad trace is rejected with its line number (exit 2) before
anything is simulated.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from uniun.actors.policy import POLICIES
from uniun.actors.sim.simulator import CostModel, Simulation, format_table, summarize
from uniun.actors.sim.trace import TraceError, load_trace

_DEFAULTS = CostModel()


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "simulate", help="replay a workload trace against a scheduling policy",
        description="Replay TRACE.jsonl (one event per line: submit, cancel, foreground, "
                    "lifecycle) against a policy with a simulated runner, until every "
                    "job has ended. Prints wait / time-to-first-token / completion per "
                    "kind, runner share per flow, swaps, preemptions and lost jobs.")
    parser.add_argument("trace", type=Path, metavar="TRACE.jsonl")
    parser.add_argument("--policy", choices=sorted(POLICIES), default="uniun",
                        help="scheduling policy (default uniun)")
    parser.add_argument("--prefill-ms-per-token", type=float,
                        default=_DEFAULTS.prefill_ms_per_token, metavar="X",
                        help=f"prefill cost (default {_DEFAULTS.prefill_ms_per_token})")
    parser.add_argument("--decode-ms-per-token", type=float,
                        default=_DEFAULTS.decode_ms_per_token, metavar="Y",
                        help=f"decode cost (default {_DEFAULTS.decode_ms_per_token})")
    parser.add_argument("--swap-s", type=float, default=_DEFAULTS.swap_s, metavar="Z",
                        help=f"model swap cost in seconds (default {_DEFAULTS.swap_s})")
    parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                        help="take [policy] settings from this runtime config file")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--trace-out", type=Path, default=None, metavar="FILE.json",
                        help="also write the run's timeline as a Chrome trace (open in "
                             "Perfetto or chrome://tracing; same layout as `trace export`)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from uniun.runtime.config import DEFAULT_CHAT_MODEL, ConfigError, load_config

    try:
        cost = CostModel(args.prefill_ms_per_token, args.decode_ms_per_token, args.swap_s)
    except ValueError as err:
        print(f"uniun-runtime simulate: {err}", file=sys.stderr)
        return 2
    policy_config = None
    default_model = DEFAULT_CHAT_MODEL
    if args.config is not None:
        try:
            runtime_config = load_config(args.config)
        except ConfigError as err:
            print(f"uniun-runtime simulate: {err}", file=sys.stderr)
            return 2
        policy_config = runtime_config.policy.policy_config()
        default_model = runtime_config.models.chat_model
    try:
        events = load_trace(args.trace, default_model=default_model)
    except TraceError as err:
        print(f"uniun-runtime simulate: {args.trace}: {err}", file=sys.stderr)
        return 2
    sim = Simulation(args.policy, events, cost, config=policy_config,
                     default_model=default_model)
    summary = summarize(sim.run())
    if args.trace_out is not None:
        from uniun.runtime.timeline import chrome_trace

        trace = chrome_trace(sim.timeline.segments, sim.timeline.marks,
                             source="uniun simulator", origin=0.0)
        try:
            args.trace_out.write_text(json.dumps(trace), encoding="utf-8")
        except OSError as err:
            print(f"uniun-runtime simulate: cannot write {args.trace_out}: {err}",
                  file=sys.stderr)
            return 1
        print(f"trace: {len(sim.timeline.segments)} segments, {len(sim.timeline.marks)} "
              f"instants -> {args.trace_out}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    else:
        print(format_table(summary))
    return 0
