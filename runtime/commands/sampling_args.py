"""The sampling flags ``submit``, ``chat`` and ``models run`` share, and the map they make.

Each flag is one key of the job map's ``sampling`` (docs/protocol.md); a flag left out is
left out of the map, and ``--defaults`` says what an absent key means: ``model`` (the
model's chat defaults, docs/models.md "Chat defaults": a repetition penalty, the model's
advised temperature) or ``none`` (greedy, no penalty: reproducible text).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_sampling_args", "sampling_map"]

# flag -> sampling key, type
_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("--temperature", "temperature", float, "0 = greedy"),
    ("--top-p", "top_p", float, "nucleus mass kept, (0, 1]"),
    ("--top-k", "top_k", int, "keep the K most likely tokens, 0 = off"),
    ("--min-p", "min_p", float, "drop tokens below P x the top one's probability"),
    ("--seed", "seed", int, "sampling seed (same seed, same text)"),
    ("--repeat-penalty", "repetition_penalty", float,
     "llama.cpp's repeat_penalty: divide the logit of a recent token by R (1 = off)"),
    ("--repeat-last-n", "repeat_last_n", int,
     "the window of --repeat-penalty, tokens (-1 = all, 0 = off; default 64)"),
    ("--frequency-penalty", "frequency_penalty", float,
     "OpenAI's: minus F per earlier occurrence in the answer, [-2, 2]"),
    ("--presence-penalty", "presence_penalty", float,
     "OpenAI's: minus P once a token occurred in the answer, [-2, 2]"),
)


def add_sampling_args(parser: argparse.ArgumentParser, *, defaults_help: str) -> None:
    """Add the sampling flags; ``defaults_help`` says what ``--defaults`` is when omitted."""
    group = parser.add_argument_group("sampling (each flag left out follows --defaults)")
    for flag, key, kind, text in _FLAGS:
        names = [flag, "--repetition-penalty"] if key == "repetition_penalty" else [flag]
        group.add_argument(*names, dest=f"s_{key}", type=kind, default=None, metavar="X",
                           help=text)
    group.add_argument("--defaults", choices=("model", "none"), default=None,
                       help="what a flag left out means: the model's chat defaults, or "
                            f"greedy with no penalty (default: {defaults_help})")


def sampling_map(args: argparse.Namespace, *, defaults: str) -> dict[str, Any]:
    """The job map's ``sampling`` for these flags: the keys given, and ``defaults: model``
    when ``--defaults`` (else ``defaults``, the command's own default) says so."""
    out: dict[str, Any] = {key: getattr(args, f"s_{key}") for _, key, _, _ in _FLAGS
                           if getattr(args, f"s_{key}", None) is not None}
    if (args.defaults or defaults) == "model":
        out["defaults"] = "model"
    return out
