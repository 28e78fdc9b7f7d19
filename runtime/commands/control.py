"""``cancel``, ``foreground`` and ``lifecycle``: the one-line requests to the scheduler."""

from __future__ import annotations

import argparse

from uniun.runtime.commands.common import add_connection_args, client_command, connect


def register(sub: argparse._SubParsersAction) -> None:
    cancel = sub.add_parser(
        "cancel", help="cancel a queued or running job",
        description="Cancel a job by id: a queued job is removed; a running one stops at "
                    "the next token and its parked KV cache is freed.")
    cancel.add_argument("job_id", metavar="JOB_ID")
    add_connection_args(cancel)
    cancel.set_defaults(func=run_cancel)

    fg = sub.add_parser(
        "foreground", help="tell the scheduler which job kind the user is looking at",
        description="Jobs of the foreground kind run in tier T1, ahead of background work "
                    "(for extract, only jobs submitted with --hint). 'none' clears it.")
    fg.add_argument("kind", metavar="KIND|none")
    add_connection_args(fg)
    fg.set_defaults(func=run_foreground)

    life = sub.add_parser(
        "lifecycle", help="tell the scheduler whether the app is in front or in background",
        description="background: each non-chat dispatch gets 25%% of its max_new_tokens, "
                    "then pauses until the app returns; foreground: full budgets.")
    life.add_argument("state", choices=("foreground", "background"))
    add_connection_args(life)
    life.set_defaults(func=run_lifecycle)


@client_command
def run_cancel(args: argparse.Namespace) -> int:
    with connect(args) as client:
        client.cancel(args.job_id)
    print(f"cancelled {args.job_id}")
    return 0


@client_command
def run_foreground(args: argparse.Namespace) -> int:
    kind = None if args.kind.lower() == "none" else args.kind
    with connect(args) as client:
        client.foreground(kind)
    print(f"foreground: {kind or 'none'}")
    return 0


@client_command
def run_lifecycle(args: argparse.Namespace) -> int:
    with connect(args) as client:
        client.lifecycle(args.state)
    print(f"lifecycle: {args.state}")
    return 0
