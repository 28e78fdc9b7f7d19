"""``uniun-runtime fuzz``: hostile frames against a running scheduler, with a verdict.

With ``--http``, hostile HTTP requests against the running gateway instead
(``fuzz_http.py``).

The same fuzzer the test suite runs for a bounded number of frames
(``runtime/chaos/fuzz.py``), for as many as one asks: every request answered exactly
once, every error code in docs/protocol.md's table, never ``internal``, the scheduler never
restarted. Exit status 0 only if all of that held. Needs Hypothesis (the ``test`` extra).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from uniun.runtime.commands.common import fail
from uniun.runtime.commands.fuzz_http import add_http_args, emit, front_socket, run_http


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "fuzz", help="send hostile frames to the scheduler (or, with --http, hostile "
                     "requests to the HTTP gateway) and check every answer",
        description="Send N Hypothesis-generated hostile frames (every request type, every "
                    "job-map field, garbage) to a running scheduler, one at a time, and "
                    "check: exactly one reply per request, every error code in the "
                    "protocol's table, never 'internal', the scheduler not restarted. "
                    "Valid submits in the mix run tiny jobs (1-4 tokens) on the runtime. "
                    "With --http: probe the gateway's door (foreign Host and Origin, a "
                    "text/plain body, a 256 MiB Content-Length), then send N hostile HTTP "
                    "requests to every route and check: no 5xx, every error an OpenAI error "
                    "object with nothing internal in it, the gateway's RSS bounded.")
    parser.add_argument("--frames", type=int, default=1000, metavar="N",
                        help="frames to send (default 1000)")
    parser.add_argument("--seed", type=int, default=0, metavar="K",
                        help="Hypothesis seed (default 0; the seed picks the random source)")
    parser.add_argument("--front", metavar="ENDPOINT", default=None,
                        help="scheduler endpoint (default: the running runtime's)")
    parser.add_argument("--client-key", type=Path, default=None, metavar="FILE",
                        help="CURVE client key for a tcp front (default: this home's)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--out", type=Path, default=None, metavar="FILE.json",
                        help="also write the JSON report there")
    add_http_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.http:
        return run_http(args)
    try:
        from uniun.runtime.chaos.fuzz import run_wire_fuzz
    except ImportError as err:
        fail(f"the fuzzer needs Hypothesis ({err}); install the test extra: "
             "pip install 'uniun-runtime[test]'")
        return 2
    if args.frames < 1:
        fail("--frames must be at least 1")
        return 2
    if (front := front_socket(args)) is None:
        return 2
    endpoint, options = front
    report = run_wire_fuzz(endpoint, args.frames, args.seed, socket_options=options)
    emit(args, report.to_json(), report.text())
    return 0 if report.ok else 1
