"""The sampling flags ``submit``, ``chat`` and ``models run`` share, and the map they make.

Each flag is one key of the job map's ``sampling`` (docs/protocol.md); a flag left out is
left out of the map, and ``--defaults`` says what an absent key means: ``model`` (the
model's chat defaults, docs/models.md "Chat defaults": a repetition penalty, the model's
advised temperature) or ``none`` (greedy, no penalty: reproducible text).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from uniun.protocol.sampling_fields import CONTROLS, DEFAULTS_MODES, Control

__all__ = ["add_sampling_args", "sampling_map"]


def _checked(control: Control) -> Callable[[str], int | float]:
    """The flag's argparse type: the value, or the range the wire would refuse it with
    (argparse prints ``argument --top-p: must be a number in (0, 1] (1 = off)``)."""
    def parse(text: str) -> int | float:
        try:
            value: int | float = int(text) if control.kind is int else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(control.rule()) from None
        if not control.admits(value):
            raise argparse.ArgumentTypeError(control.rule())
        return value

    parse.__name__ = control.key
    return parse


def add_sampling_args(parser: argparse.ArgumentParser, *, defaults_help: str) -> None:
    """Add the sampling flags (one per control of ``protocol/sampling_fields.py``);
    ``defaults_help`` says what ``--defaults`` is when omitted."""
    group = parser.add_argument_group("sampling (each flag left out follows --defaults)")
    for key, control in CONTROLS.items():
        group.add_argument(control.flag, *control.flag_aliases, dest=f"s_{key}",
                           type=_checked(control), default=None, metavar="X",
                           help=f"{control.help}: {control.bounds()}")
    group.add_argument("--defaults", choices=DEFAULTS_MODES, default=None,
                       help="what a flag left out means: the model's chat defaults, or "
                            f"greedy with no penalty (default: {defaults_help})")


def sampling_map(args: argparse.Namespace, *, defaults: str) -> dict[str, Any]:
    """The job map's ``sampling`` for these flags: the keys given, and ``defaults: model``
    when ``--defaults`` (else ``defaults``, the command's own default) says so."""
    out: dict[str, Any] = {key: getattr(args, f"s_{key}") for key in CONTROLS
                           if getattr(args, f"s_{key}", None) is not None}
    if (args.defaults or defaults) == "model":
        out["defaults"] = "model"
    return out
