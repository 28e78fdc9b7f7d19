"""``uniun-runtime keys``: the CURVE keys that guard a tcp:// front and embedding pool.

``init`` makes the server key and a key for this machine's CLI (``clients/local``,
allowed at once); ``create NAME`` makes another client's pair and allows it; ``allow
FILE`` puts someone else's public key on the allow-list; ``revoke NAME`` takes one off
(from the next connection; no restart); ``list`` shows them. Everything lives under
``$UNIUN_HOME/keys`` with 0600 files (protocol/curve.py; docs/protocol.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from uniun.protocol.curve import (
    SERVER,
    CurveError,
    allow,
    allowed_keys,
    create_pair,
    load_public,
    revoke,
)
from uniun.runtime.commands.common import fail
from uniun.runtime.security import keys_paths

LOCAL = "local"  # the key ``init`` makes for this machine's own CLI


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "keys", help="CURVE keys for tcp endpoints: init, create, allow, revoke, list",
        description="Manage the CURVE keys under $UNIUN_HOME/keys that authenticate "
                    "clients of a tcp:// front or embedding pool. A server key turns "
                    "CURVE on for every tcp endpoint of this home; only allowed client "
                    "keys are served.")
    actions = parser.add_subparsers(dest="keys_command", metavar="ACTION")
    init = actions.add_parser("init", help="make the server key and a 'local' client key")
    init.set_defaults(func=run_init)
    create = actions.add_parser("create", help="make a client key pair and allow it")
    create.add_argument("name", help="the client's name (A-Z a-z 0-9 . _ -)")
    create.add_argument("--no-allow", action="store_true", help="make it, do not allow it")
    create.set_defaults(func=run_create)
    allow_p = actions.add_parser("allow", help="allow a client's public key file")
    allow_p.add_argument("file", type=Path, help="the client's NAME.key (public) file")
    allow_p.add_argument("--name", default=None, help="name to list it under (default: "
                                                      "the file's name)")
    allow_p.set_defaults(func=run_allow)
    revoke_p = actions.add_parser("revoke", help="take a client key off the allow-list")
    revoke_p.add_argument("name")
    revoke_p.set_defaults(func=run_revoke)
    list_p = actions.add_parser("list", help="show the server key and the allowed keys")
    list_p.set_defaults(func=run_list)
    parser.set_defaults(func=lambda _args: parser.print_help() or 2)


def _guard(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A key command whose :class:`CurveError` becomes one line on stderr and exit code 1."""
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except CurveError as err:
            fail(str(err))
            return 1
    return wrapper


@_guard
def run_init(args: argparse.Namespace) -> int:
    paths = keys_paths()
    if paths.has_server_key():
        server_key = load_public(paths.server_public).decode()
        print(f"server key already in {paths.root} (public {server_key})")
    else:
        create_pair(paths.root, SERVER)
        print(f"made the server key: {paths.server_public}")
    if not paths.client_secret(LOCAL).exists():
        public, _ = create_pair(paths.clients, LOCAL)
        allow(paths, public, LOCAL)
        print(f"made and allowed the '{LOCAL}' client key (this machine's CLI): "
              f"{paths.client_secret(LOCAL)}")
    print("tcp endpoints of this home now need CURVE; restart a running runtime",
          file=sys.stderr)
    return 0


@_guard
def run_create(args: argparse.Namespace) -> int:
    paths = keys_paths()
    public, secret = create_pair(paths.clients, args.name)
    if not args.no_allow:
        allow(paths, public, args.name)
    print(f"{secret}\n  give the client this file (secret) and {paths.server_public} "
          f"(the server's public key){'' if args.no_allow else '; allowed'}")
    return 0


@_guard
def run_allow(args: argparse.Namespace) -> int:
    target = allow(keys_paths(), args.file, args.name)
    print(f"allowed {target.name[:-len('.key')]} ({load_public(target).decode()}); "
          "counts from the next connection")
    return 0


@_guard
def run_revoke(args: argparse.Namespace) -> int:
    revoke(keys_paths(), args.name)
    print(f"revoked {args.name}; new connections with it are refused (open ones stay "
          "until they reconnect)")
    return 0


@_guard
def run_list(args: argparse.Namespace) -> int:
    paths = keys_paths()
    if paths.has_server_key():
        print(f"server  {load_public(paths.server_public).decode()}  {paths.server_public}")
    else:
        print(f"no server key in {paths.root} (tcp endpoints run without CURVE; "
              "uniun-runtime keys init)")
    for name, public in allowed_keys(paths).items():
        print(f"allowed {public.decode()}  {name}")
    return 0
