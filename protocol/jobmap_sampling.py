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

from dataclasses import dataclass, fields
from typing import Any

from uniun.protocol.errors import InvalidField
from uniun.protocol.sampling_fields import CONTROLS, DEFAULTS_MODES, KEYS

__all__ = ["DEFAULTS_MODES", "SAMPLING_KEYS", "Sampling", "parse_sampling"]

MAX_SHOWN_KEY = 64


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen, as asked. ``temperature == 0`` means greedy.

    One field per control of ``protocol/sampling_fields.py`` (their ranges, neutral values
    and meanings are declared there), in its order, then ``defaults``."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None  # None: drawn once per job, then recorded
    min_p: float | None = None
    repetition_penalty: float | None = None
    repeat_last_n: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    defaults: str | None = None  # "model": absent fields take the model's chat defaults

    def to_map(self) -> dict[str, Any]:
        """The given keys only (a spec parsed from this map equals this one)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}


SAMPLING_KEYS = frozenset(f.name for f in fields(Sampling))
if tuple(f.name for f in fields(Sampling)) != (*KEYS, "defaults"):  # pragma: no cover
    raise ImportError("Sampling's fields differ from protocol/sampling_fields.py")


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
    given: dict[str, Any] = {}
    for key, control in CONTROLS.items():
        raw = value.get(key)
        if raw is None:
            continue
        if not control.admits(raw):
            raise InvalidField(f"sampling.{key}", control.rule())
        given[key] = control.typed(raw)
    defaults = value.get("defaults")
    if defaults is not None and defaults not in DEFAULTS_MODES:
        raise InvalidField("sampling.defaults", f"must be one of {', '.join(DEFAULTS_MODES)}")
    return Sampling(**given, defaults=defaults)
