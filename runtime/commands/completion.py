"""``uniun-runtime completion bash|zsh``: a shell completion script on stdout.

Generated from the command's own argparse parser by ``shtab``, so every command and
option (and the ones added later) completes without a hand-kept list. Install::

    uniun-runtime completion bash > ~/.local/share/bash-completion/completions/uniun-runtime
    uniun-runtime completion zsh > "${fpath[1]}/_uniun-runtime"     # then: compinit
"""

from __future__ import annotations

import argparse
import sys

SHELLS = ("bash", "zsh")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "completion", help="print a bash or zsh completion script",
        description="Print the completion script for SHELL. bash: save it as "
                    "~/.local/share/bash-completion/completions/uniun-runtime (or source "
                    "it from ~/.bashrc). zsh: save it as _uniun-runtime in a folder of "
                    "$fpath, then run compinit.")
    parser.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash or zsh")
    parser.set_defaults(func=run)


def script(shell: str) -> str:
    import shtab

    from uniun.runtime.cli import build_parser

    return shtab.complete(build_parser(), shell=shell)


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(script(args.shell))
    return 0
