"""``uniun-runtime deck [--watch] [--take N]``: Nataraj's deck of generated cards.

Without flags it lists the cards in the deck (read straight from the results database;
no runtime needed). ``--take N`` takes the N oldest cards out, as reading them does, which
lets the Nataraj producer refill the deck.

``--watch`` is "the deck page is open": it sets ``foreground nataraj`` (the scheduler
hoists card jobs to T1) and shows cards as they come, taking one every ``--pace``
seconds like a reader would (``--pace 0``: only look). Leaving -- Ctrl-C, SIGTERM or
``--for`` running out -- restores the foreground it found.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any

from uniun.runtime.commands.common import add_connection_args, client_command, connect
from uniun.runtime.commands.producer_common import (
    add_json_flag,
    foreground_while,
    open_store,
    runtime_config,
)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "deck", help="show Nataraj's deck of generated cards (--watch: the deck page is open)",
        description="Show the cards the Nataraj producer generated. --watch keeps the deck "
                    "page open: foreground 'nataraj' while it runs, cleared on exit.")
    parser.add_argument("--watch", action="store_true",
                        help="stay open: foreground nataraj, show cards as they arrive")
    parser.add_argument("--take", type=int, metavar="N", default=0,
                        help="take the N oldest cards out of the deck (you read them)")
    parser.add_argument("--pace", type=float, metavar="S", default=5.0,
                        help="with --watch: take one card every S seconds (0: never; "
                             "default 5)")
    parser.add_argument("--for", dest="duration", type=float, metavar="S", default=None,
                        help="with --watch: leave after S seconds (default: until Ctrl-C)")
    parser.add_argument("--limit", type=int, metavar="N", default=50,
                        help="cards listed at most (default 50)")
    add_json_flag(parser)
    add_connection_args(parser)
    parser.set_defaults(func=run)


def _print_cards(cards: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        for card in cards:
            print(json.dumps({k: card[k] for k in ("job_id", "topic", "text", "created")},
                             ensure_ascii=False), flush=True)
        return
    for card in cards:
        print(f"--- {card['topic'] or 'card'} ({card['job_id']})")
        print(card["text"], flush=True)


@client_command
def run(args: argparse.Namespace) -> int:
    if args.take < 0 or args.limit < 1 or args.pace < 0:
        print("uniun-runtime: --take, --limit and --pace must not be negative", file=sys.stderr)
        return 2
    config = runtime_config()
    store = open_store(config)
    try:
        if args.watch:
            return _watch(args, store)
        if args.take:
            _print_cards(store.take_cards(args.take), args.json)
            return 0
        cards = store.deck(args.limit)
        _print_cards(cards, args.json)
        if not args.json:
            p = config.producers
            print(f"[{store.deck_size()} card(s) in the deck; Nataraj keeps it between "
                  f"{p.deck_low} and {p.deck_high}]", file=sys.stderr)
        return 0
    finally:
        store.close()


def _watch(args: argparse.Namespace, store: Any) -> int:
    """The watch loop. Ctrl-C and SIGTERM only set a flag, and the handlers go in before
    the foreground is set, so that leaving always passes through the restore.

    Why not ``KeyboardInterrupt``: (1) a process started in the background of a
    non-interactive shell (``bin/test &``, CI) inherits SIGINT *ignored*, and Python then
    installs no Ctrl-C handler at all: the signal did nothing and the page stayed open;
    (2) an interrupt raised between the ``foreground`` request reaching the scheduler and
    its reply left ``foreground = nataraj`` behind with nothing to restore it. A second
    Ctrl-C while leaving interrupts for real.
    """
    leave: list[int] = []  # the signals received; a plain list, as a handler can run
    # while the main thread holds any lock (an Event's set() could deadlock there)

    def stop(signum: int, _frame: object) -> None:
        if leave and signum == signal.SIGINT:
            raise KeyboardInterrupt
        leave.append(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    shown: set[str] = set()
    try:
        with connect(args) as client, foreground_while(client, "nataraj",
                                                       timeout=args.timeout):
            print("[deck page open: foreground nataraj; Ctrl-C to leave]", file=sys.stderr)
            end = None if args.duration is None else time.monotonic() + args.duration
            next_take = time.monotonic() + args.pace
            while not leave and (end is None or time.monotonic() < end):
                fresh = [c for c in store.deck(1000) if c["job_id"] not in shown]
                _print_cards(fresh, args.json)
                shown.update(c["job_id"] for c in fresh)
                if args.pace and time.monotonic() >= next_take:
                    store.take_cards(1)
                    next_take = time.monotonic() + args.pace
                client.ping(timeout=args.timeout)  # fail fast if the runtime went away
                for _ in range(5):
                    if not leave:
                        time.sleep(0.1)
        print("[deck page closed: foreground restored]", file=sys.stderr)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
