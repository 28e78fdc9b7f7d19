"""The sampling controls, declared once: every surface that takes them is driven from here.

One :class:`Control` per key of the job map's ``sampling`` (docs/protocol.md): its type,
its range, its neutral value (what an absent key means without ``defaults: "model"``),
what it does, and how the other surfaces spell it. From this table come

- the wire's validation of the ``sampling`` map (``protocol/jobmap_sampling.py``),
- the checks and defaults of the sampler's ``SamplingParams`` (``models/sampling.py``),
- the OpenAI dialect's sampling fields in the gateway (``actors/gateway/openai_map.py``),
  under their OpenAI names and, for ``temperature``, OpenAI's own narrower range,
- the CLI's sampling flags (``runtime/commands/sampling_args.py``),

so a limit is the same everywhere and its error message reads the same on every surface
(``tests/protocol/test_sampling_fields.py`` walks the table through all four).

Pure: no I/O, nothing of ours imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["CONTROLS", "DEFAULTS_MODES", "KEYS", "Control", "is_int", "is_number"]

DEFAULTS_MODES = ("none", "model")  # ``sampling.defaults``: what an absent key means


def is_int(value: Any) -> bool:
    """An integer as JSON and msgpack carry one (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float (a bool is not one)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


@dataclass(frozen=True)
class Control:
    """One sampling control and every spelling of it."""

    key: str  # the job map's key, and SamplingParams' field
    kind: type  # int or float
    low: float
    high: float | None  # None: no upper bound
    neutral: float | int | None  # the value that changes nothing (seed: None, drawn)
    help: str  # what it does (the CLI's help)
    flag: str  # the CLI's flag; ``flag_aliases`` are accepted too
    note: str = ""  # what its special values mean, shown with its range
    low_open: bool = False  # low itself is refused
    span: str = ""  # how the range reads where its plain numbers would not
    flag_aliases: tuple[str, ...] = ()
    openai: tuple[str, ...] = ()  # its names in an OpenAI request (default: the key)
    openai_high: float | None = None  # OpenAI's narrower upper bound, where it has one

    @property
    def openai_names(self) -> tuple[str, ...]:
        return self.openai or (self.key,)

    def admits(self, value: Any, *, high: float | None = None) -> bool:
        """Whether ``value`` (of the wire's types) is in range; ``high`` narrows the top."""
        typed = is_int(value) if self.kind is int else is_number(value)
        return typed and self.in_range(value, high=high)

    def in_range(self, value: float, *, high: float | None = None) -> bool:
        """The range alone, for a value already of the right type."""
        top = self.high if high is None else high
        if not value >= self.low or (self.low_open and value == self.low):
            return False
        return top is None or value <= top

    def range_text(self, *, high: float | None = None) -> str:
        """The range in words: ``a number in (0, 1]`` (docs/protocol.md's table)."""
        top = self.high if high is None else high
        what = "an integer" if self.kind is int else "a number"
        if self.span and high is None:
            return f"{what} {self.span}"
        if top is None:
            return f"{what} >= {self.low:g}"
        return f"{what} in {'(' if self.low_open else '['}{self.low:g}, {top:g}]"

    def bounds(self, *, high: float | None = None) -> str:
        """The range and what its special values mean: ``a number in (0, 1] (1 = off)``."""
        return self.range_text(high=high) + (f" ({self.note})" if self.note else "")

    def rule(self, *, high: float | None = None) -> str:
        """The error message's rule: ``must be a number in (0, 1] (1 = off)``."""
        return f"must be {self.bounds(high=high)}"

    def typed(self, value: Any) -> int | float:
        """An admitted value as the control's type (an int given for a float counts)."""
        return int(value) if self.kind is int else float(value)


CONTROLS: dict[str, Control] = {c.key: c for c in (
    Control("temperature", float, 0.0, 10.0, 0.0,
            "divide the logits by it before the draw", "--temperature",
            note="0 = greedy", openai_high=2.0),
    Control("top_p", float, 0.0, 1.0, 1.0,
            "keep the smallest set of tokens whose probability reaches it", "--top-p",
            note="1 = off", low_open=True),
    Control("top_k", int, 0, None, 0, "keep the k most likely tokens", "--top-k",
            note="0 = off"),
    Control("seed", int, 0, 2**63 - 1, None, "the draws' seed (same seed, same text)",
            "--seed", note="none given: drawn once per job, then kept", span="in [0, 2^63)"),
    Control("min_p", float, 0.0, 1.0, 0.0,
            "drop tokens less likely than it times the most likely one", "--min-p",
            note="0 = off"),
    Control("repetition_penalty", float, 0.0, 10.0, 1.0,
            "llama.cpp's repeat_penalty: the logit of a token among the last "
            "repeat_last_n is divided by it (multiplied if <= 0)", "--repeat-penalty",
            note="1 = off", low_open=True, flag_aliases=("--repetition-penalty",),
            openai=("repetition_penalty", "repeat_penalty")),
    Control("repeat_last_n", int, -1, 1 << 20, 64,
            "the window of the repetition penalty, tokens", "--repeat-last-n",
            note="-1 = the whole history, 0 = off", span="in [-1, 2^20]"),
    Control("frequency_penalty", float, -2.0, 2.0, 0.0,
            "OpenAI's: minus it per earlier occurrence of a token in the answer",
            "--frequency-penalty", note="0 = off"),
    Control("presence_penalty", float, -2.0, 2.0, 0.0,
            "OpenAI's: minus it once a token occurred in the answer", "--presence-penalty",
            note="0 = off"),
)}
KEYS: tuple[str, ...] = tuple(CONTROLS)  # the controls' keys, in the table's order
