"""``uniun-runtime trace export``: the scheduler's timeline as a Chrome trace.

Reads the segments and instants the scheduler journals (``$UNIUN_HOME/journal.db``,
read-only, so it works while the runtime runs and after it stopped) and writes the Trace
Event Format JSON that Perfetto (ui.perfetto.dev, "Open trace file") and
``chrome://tracing`` open: a runner track of what ran, a track per tier of what waited,
and instants for preemptions, swaps and restarts (docs/observability.md).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from uniun.runtime.commands.common import fail
from uniun.runtime.paths import uniun_home

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "trace", help="export the scheduler's timeline (Perfetto / chrome://tracing)",
        description="Work with the timeline the scheduler records in its journal: every "
                    "stretch a job ran or waited, and the preempt / swap / restart "
                    "instants.")
    actions = parser.add_subparsers(dest="trace_command", metavar="ACTION")
    export = actions.add_parser(
        "export", help="write the timeline as Chrome trace-event JSON",
        description="Write the journaled timeline as Chrome trace-event JSON: open it in "
                    "Perfetto (ui.perfetto.dev) or chrome://tracing. One track for the "
                    "runner (what ran), one per tier (what waited), instants for "
                    "preemptions, swaps and restarts. Segments are written when they end, "
                    "so a job still running shows up to its last pause.")
    export.add_argument("--out", required=True, metavar="FILE.json",
                        help="where to write the trace (- for stdout)")
    export.add_argument("--since", default=None, metavar="S",
                        help="only the last S seconds (a number, or with a unit: 90s, "
                             "5m, 2h, 1d; default: everything the journal keeps)")
    export.add_argument("--journal", type=Path, default=None, metavar="PATH",
                        help="journal to read (default $UNIUN_HOME/journal.db)")
    export.set_defaults(func=run_export)
    parser.set_defaults(func=lambda _args: parser.print_help() or 2)


def parse_since(text: str) -> float:
    """``"90"``, ``"90s"``, ``"5m"``, ``"2h"``, ``"1d"`` -> seconds (ValueError if not)."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"--since: {text!r} is not a duration (try 300, 5m, 2h)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def run_export(args: argparse.Namespace) -> int:
    from uniun.actors.scheduler.journal import read_timeline
    from uniun.runtime.timeline import chrome_trace

    since = None
    if args.since is not None:
        try:
            since = time.time() - parse_since(args.since)
        except ValueError as err:
            fail(str(err))
            return 2
    path = args.journal or uniun_home() / "journal.db"
    if not path.is_file():
        fail(f"no journal at {path}: no runtime has run in this home (or pass --journal)")
        return 1
    try:
        segments, marks = read_timeline(path, since=since)
    except Exception as err:  # noqa: BLE001 - sqlite3.DatabaseError and friends: say which file
        fail(f"cannot read the timeline of {path}: {err}")
        return 1
    trace = chrome_trace(segments, marks)
    text = json.dumps(trace)
    if args.out == "-":
        sys.stdout.write(text + "\n")
    else:
        try:
            Path(args.out).write_text(text, encoding="utf-8")
        except OSError as err:
            fail(f"cannot write {args.out}: {err}")
            return 1
    ran = sum(s.lane == "run" for s in segments)
    print(f"{len(segments)} segments ({ran} ran, {len(segments) - ran} waited), "
          f"{len(marks)} instants -> {args.out}", file=sys.stderr)
    return 0
