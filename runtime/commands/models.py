"""``uniun-runtime models ...``: the model store's commands.

The group is assembled from modules named ``models_*.py`` beside this one; each exposes
``register_models(subparsers)`` and adds its own sub-commands (pull, import, list, run,
bench, ...). That keeps the store, the generation commands and the benchmark in their
own modules.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil

from uniun.runtime import commands as commands_pkg


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "models", help="pull, import, build, list, run and benchmark models",
        description="Manage the model store ($UNIUN_MODELS, default $UNIUN_HOME/models) "
                    "and try models in-process.")
    models_sub = parser.add_subparsers(dest="models_command", metavar="MODELS_COMMAND")
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
    for info in sorted(pkgutil.iter_modules(commands_pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("models_"):
            module = importlib.import_module(f"{commands_pkg.__name__}.{info.name}")
            module.register_models(models_sub)
