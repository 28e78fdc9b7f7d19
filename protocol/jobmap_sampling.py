"""The job map's ``sampling`` map (docs/protocol.md), validated into a ``Sampling``.

Every key is optional, and ``Sampling`` keeps what the client gave (None = not given):
where a field was not given decides ``defaults``. Without it (or with ``"none"``) an
absent field takes the neutral value (greedy, no filter, no penalty), so a v1 client that
sends ``{"temperature": 0}`` or nothing gets exactly the text it always got. With
``"model"`` it takes the model's chat defaults, which the runner knows
(``models/chat_defaults.py``, docs/models.md): what an interactive chat wants, so a small
model does not loop to its token limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from uniun.protocol.errors import InvalidField

__all__ = ["DEFAULTS_MODES", "SAMPLING_KEYS", "Sampling", "parse_sampling"]

DEFAULTS_MODES = ("none", "model")
MAX_SHOWN_KEY = 64


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen, as asked. ``temperature == 0`` means greedy."""

    temperature: float | None = None  # [0, 10]; 0 = greedy (the neutral default)
    top_p: float | None = None  # (0, 1]; 1 = off
    top_k: int | None = None  # >= 0; 0 = off
    seed: int | None = None  # [0, 2^63); None = drawn once per job, then recorded
    min_p: float | None = None  # [0, 1]; 0 = off
    repetition_penalty: float | None = None  # (0, 10]; 1 = off (llama.cpp's repeat_penalty)
    repeat_last_n: int | None = None  # >= -1; the window, tokens (64; -1 = all, 0 = off)
    frequency_penalty: float | None = None  # [-2, 2]; 0 = off (OpenAI's)
    presence_penalty: float | None = None  # [-2, 2]; 0 = off (OpenAI's)
    defaults: str | None = None  # "model": absent fields take the model's chat defaults

    def to_map(self) -> dict[str, Any]:
        """The given keys only (a spec parsed from this map equals this one)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}


SAMPLING_KEYS = frozenset(f.name for f in fields(Sampling))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _number(value: dict[str, Any], key: str, low: float, high: float, rule: str, *,
            open_low: bool = False) -> float | None:
    raw = value.get(key)
    if raw is None:
        return None
    if not _is_number(raw) or raw > high or raw < low or (open_low and raw == low):
        raise InvalidField(f"sampling.{key}", rule)
    return float(raw)


def parse_sampling(value: Any) -> Sampling:
    """Check the ``sampling`` map; raise :class:`InvalidField` naming the bad key."""
    if value is None:
        return Sampling()
    if not isinstance(value, dict):
        raise InvalidField("sampling", "must be a map")
    unknown = set(value) - SAMPLING_KEYS
    if unknown:
        key = str(min(map(str, unknown)))
        shown = key if len(key) <= MAX_SHOWN_KEY else key[:MAX_SHOWN_KEY] + "..."
        raise InvalidField(f"sampling.{shown}", "unknown sampling key")
    temperature = _number(value, "temperature", 0.0, 10.0, "must be a number in [0, 10]")
    top_p = _number(value, "top_p", 0.0, 1.0, "must be a number in (0, 1]", open_low=True)
    top_k = value.get("top_k")
    if top_k is not None and (not _is_int(top_k) or top_k < 0):
        raise InvalidField("sampling.top_k", "must be an integer >= 0 (0 = off)")
    seed = value.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        raise InvalidField("sampling.seed", "must be an integer in [0, 2^63) or nil")
    min_p = _number(value, "min_p", 0.0, 1.0, "must be a number in [0, 1] (0 = off)")
    repetition = _number(value, "repetition_penalty", 0.0, 10.0,
                         "must be a number in (0, 10] (1 = off)", open_low=True)
    last_n = value.get("repeat_last_n")
    if last_n is not None and (not _is_int(last_n) or not -1 <= last_n <= 1 << 20):
        raise InvalidField("sampling.repeat_last_n",
                           "must be an integer >= -1 (-1 = the whole history, 0 = off)")
    frequency = _number(value, "frequency_penalty", -2.0, 2.0, "must be a number in [-2, 2]")
    presence = _number(value, "presence_penalty", -2.0, 2.0, "must be a number in [-2, 2]")
    defaults = value.get("defaults")
    if defaults is not None and defaults not in DEFAULTS_MODES:
        raise InvalidField("sampling.defaults", f"must be one of {', '.join(DEFAULTS_MODES)}")
    return Sampling(temperature=temperature, top_p=top_p,
                    top_k=None if top_k is None else int(top_k), seed=seed, min_p=min_p,
                    repetition_penalty=repetition,
                    repeat_last_n=None if last_n is None else int(last_n),
                    frequency_penalty=frequency, presence_penalty=presence, defaults=defaults)
