"""``cancel``, ``foreground`` and ``lifecycle``: the one-line requests to the scheduler."""

from __future__ import annotations

import argparse

from uniun.protocol.power_state import THERMAL_STATES
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
                    "then pauses until the app returns; foreground: full budgets. The power "
                    "flags push the device's facts as an app would from its OS (they win "
                    "over what the scheduler reads from sysfs; docs/device.md); with them, "
                    "STATE may be left out.")
    life.add_argument("state", nargs="?", choices=("foreground", "background"))
    power = life.add_mutually_exclusive_group()
    power.add_argument("--battery", dest="on_battery", action="store_const", const=True,
                       help="the device runs from its battery")
    power.add_argument("--charger", dest="on_battery", action="store_const", const=False,
                       help="the device is on its charger")
    life.add_argument("--percent", type=float, metavar="0-100", help="the battery level")
    life.add_argument("--thermal", choices=THERMAL_STATES, help="the device's thermal state")
    idle = life.add_mutually_exclusive_group()
    idle.add_argument("--user-idle", dest="user_idle", action="store_const", const=True,
                      help="the user is away (screen off, session idle)")
    idle.add_argument("--user-active", dest="user_idle", action="store_const", const=False,
                      help="the user is at the device")
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
    power = {name: getattr(args, name) for name in ("on_battery", "percent", "thermal",
                                                    "user_idle")
             if getattr(args, name) is not None}
    if args.state is None and not power:
        raise SystemExit("error: lifecycle needs STATE (foreground|background), "
                         "a power flag (--battery, --charger, --percent, --thermal, "
                         "--user-idle, --user-active), or both")
    with connect(args) as client:
        client.lifecycle(args.state, power=power or None)
    said = [f"lifecycle: {args.state}"] if args.state else []
    said += [f"power: {k}={v}" for k, v in power.items()]
    print(", ".join(said))
    return 0
