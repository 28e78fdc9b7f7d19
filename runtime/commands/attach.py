"""``uniun-runtime attach JOB_ID``: follow a job submitted earlier (``submit --no-wait``).

Subscribes to the job's events over a new connection. Tokens already streamed are
printed again unless ``--after-seq`` says how many the caller has; an ended job prints
its outcome at once. Ctrl-C detaches (the job keeps running; ``cancel`` stops it).
"""

from __future__ import annotations

import argparse
import sys
import time

from uniun.runtime.commands.common import add_connection_args, client_command, connect
from uniun.runtime.commands.submit import follow, follow_json


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "attach", help="follow a job submitted earlier (e.g. with submit --no-wait)",
        description="Follow the events of a job by its id: its tokens to stdout (again from "
                    "the start, or after --after-seq), pauses and timings to stderr. A job "
                    "that already ended prints its outcome. Ctrl-C detaches; the job keeps "
                    "running.")
    parser.add_argument("job_id", metavar="JOB_ID")
    parser.add_argument("--after-seq", type=int, default=-1, metavar="N",
                        help="tokens up to seq N are already held: start after them")
    parser.add_argument("--json", action="store_true",
                        help="print the reply and every event as JSON lines on stdout")
    parser.add_argument("--events", action="store_true",
                        help="print every job event (started, paused, ...) to stderr")
    add_connection_args(parser)
    parser.set_defaults(func=run)


@client_command
def run(args: argparse.Namespace) -> int:
    with connect(args) as client:
        sent = time.monotonic()
        stream = client.attach(args.job_id, after_seq=args.after_seq)
        try:
            if args.json:
                return follow_json(stream)
            accepted = stream.accepted or {}
            if args.events:
                print(f"[attached to {args.job_id}: {accepted.get('state')}, "
                      f"{accepted.get('streamed')} tokens streamed, tier "
                      f"{accepted.get('tier')}]", file=sys.stderr)
            return follow(client, stream, sent=sent, verbose=args.events)
        except KeyboardInterrupt:
            print(f"\n[detached from {args.job_id}; it keeps running]", file=sys.stderr)
            return 130
