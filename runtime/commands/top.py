"""``uniun-runtime top``: watch the scheduler work, live, over the front socket.

It asks ``status`` a few times a second (like any client; nothing else is needed, so it
works against a remote ``--front`` too) and redraws one full-terminal frame
(``runtime/top_view.py``): the running job with its rate, the queues per tier with the
next jobs, vruntime per flow, the T2 share against its budget, parked snapshots, every
process with CPU and memory, and recent preemptions, resumes, swaps and restarts.
``--once`` prints one frame as plain text and exits (scripts, tests, bug reports). When
the runtime stops the view says so and keeps retrying; Ctrl-C quits.
"""

from __future__ import annotations

import argparse
import sys
import time

from uniun.protocol.client import ClientError, SchedulerUnavailable, Timeout
from uniun.runtime.commands.common import add_connection_args, client_command, connect

RECONNECT_S = 2.0  # a live view waits this long for a lost runtime before saying so


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "top", help="live view of the scheduler: running job, queues, flows, processes",
        description="A live full-terminal view of the running runtime, refreshed several "
                    "times a second over the front socket: loaded model, running job "
                    "(kind, tier, tokens, tokens/s), queue per tier with the next jobs, "
                    "vruntime per flow, T2 share against its budget, parked snapshots, "
                    "lifecycle and foreground, each process (pid, CPU %, RSS, restarts) "
                    "and recent events (preempt, resume, swap, restart). Ctrl-C quits.")
    parser.add_argument("--once", action="store_true",
                        help="print one frame as plain text and exit")
    parser.add_argument("--interval", type=float, default=0.25, metavar="S",
                        help="seconds between refreshes (default 0.25)")
    parser.add_argument("--width", type=int, default=None, metavar="N",
                        help="columns of a --once frame (default: the terminal's, or 100)")
    add_connection_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        print("uniun-runtime top: --interval must be > 0", file=sys.stderr)
        return 2
    if args.once or not sys.stdout.isatty():
        return once(args)
    return live(args)


@client_command
def once(args: argparse.Namespace) -> int:
    from uniun.runtime.top_view import WIDE, frame_text

    with connect(args) as client:
        status = client.status()
        endpoint = client.endpoint
    width = args.width or (_terminal_width() if sys.stdout.isatty() else WIDE)
    sys.stdout.write(frame_text(status, endpoint=endpoint, width=width))
    return 0


@client_command
def live(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from uniun.runtime.top_view import Rates, down_frame, render_frame

    console = Console()
    rates = Rates()
    with connect(args) as client:
        client.reconnect_timeout = RECONNECT_S  # say "not answering" soon, then retry
        endpoint = client.endpoint
        down_since: float | None = None
        with Live(console=console, screen=True, auto_refresh=False,
                  redirect_stderr=False) as view:
            try:
                while True:
                    now = time.time()
                    try:
                        status = client.status(timeout=max(1.0, args.interval * 4))
                        down_since = None
                        rates.update(status, time.monotonic())
                        frame = render_frame(status, endpoint=endpoint,
                                             width=console.size.width, now=now, rates=rates)
                    except (SchedulerUnavailable, Timeout, ClientError) as err:
                        down_since = down_since or now
                        frame = down_frame(endpoint, down_since, type(err).__name__, now)
                    view.update(frame, refresh=True)
                    time.sleep(args.interval)
            except KeyboardInterrupt:
                return 0


def _terminal_width() -> int:
    import shutil

    return shutil.get_terminal_size((100, 40)).columns


def watch_plain(args: argparse.Namespace) -> int:
    """``status --watch``: a plain frame every ``interval`` seconds, separated by a blank
    line; a runtime that stops is reported on one line and polled again. Ctrl-C ends."""
    from uniun.runtime.top_view import WIDE, Rates, frame_text

    if args.interval <= 0:
        print("uniun-runtime status: --interval must be > 0", file=sys.stderr)
        return 2
    rates = Rates()
    with connect(args) as client:
        client.reconnect_timeout = RECONNECT_S
        endpoint = client.endpoint
        try:
            while True:
                try:
                    status = client.status(timeout=max(1.0, args.interval))
                    rates.update(status, time.monotonic())
                    width = _terminal_width() if sys.stdout.isatty() else WIDE
                    sys.stdout.write(frame_text(status, endpoint=endpoint, width=width,
                                                rates=rates) + "\n")
                except (SchedulerUnavailable, Timeout, ClientError) as err:
                    sys.stdout.write(f"{time.strftime('%H:%M:%S')} runtime not answering at "
                                     f"{endpoint} ({type(err).__name__}); retrying\n")
                sys.stdout.flush()
                time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0
