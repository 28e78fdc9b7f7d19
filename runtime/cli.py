"""The ``uniun-runtime`` command.

Each command lives in its own module under ``uniun.runtime.commands`` and exposes
``register(subparsers)``, which adds its sub-parser and sets ``func`` to a function
``(args) -> int``. This file only collects them, so rooms can add commands without
touching each other.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from uniun.runtime import commands as commands_pkg


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="uniun-runtime",
        description=(
            "UNIUN runtime: one on-device LLM shared by chat and background producers, "
            "scheduled so that chat answers at once and no background work is lost."
        ),
    )
    parser.add_argument("--version", action="version",
                        version=f"uniun-runtime {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands_pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands_pkg.__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("uniun-runtime")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    from uniun.runtime.paths import private_umask

    private_umask()  # the home, results.db, a pulled model: owner-only (docs/security.md)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
