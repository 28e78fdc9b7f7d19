"""Choosing the next token from logits: greedy, temperature, top-k, top-p, min-p, seeded.

Why a counter-based random stream: a job can be paused, spilled to disk, and resumed in
another runner process — or rebuilt from nothing but its token ids (recompute). If the
random draws came from a stateful generator, its state would have to travel with every
parked job and survive every path. Instead the draw for the token at position ``seq`` is
a pure function of ``(seed, seq)``: the only state is the seed, and "same seed, same text"
holds across any number of pauses and resumes.

``temperature == 0`` means greedy (argmax; ties go to the lowest token id), as on the wire
(docs/protocol.md ``sampling``). ``top_k == 0``, ``top_p == 1`` and ``min_p == 0`` disable
those filters. The order is temperature, then top-k, top-p and min-p on the tempered
distribution (as transformers and vLLM do). Penalties on repeated tokens come before all
of it and depend on the job's token history: :mod:`uniun.models.penalties`.

No I/O and no onnxruntime here: the policy of choosing lives apart from the model.
"""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

import numpy as np

from uniun.protocol.sampling_fields import CONTROLS, DEFAULTS_MODES, KEYS

__all__ = ["DEFAULTS_MODES", "FIELDS", "Sampler", "SamplingParams", "sample_token"]


class _SamplingLike(Protocol):
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None


FIELDS = KEYS  # SamplingParams' fields: the sampling controls, in their declared order


def _neutral(key: str) -> Any:
    return CONTROLS[key].neutral


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. Mirrors ``uniun.protocol.jobmap.Sampling`` (accepted too).

    One field per control of ``protocol/sampling_fields.py``, which declares its range,
    its meaning and its default: the neutral value, which leaves the logits untouched
    (greedy, no filter, no penalty). Out of range is a ``ValueError`` naming the field.
    """

    temperature: float = _neutral("temperature")
    top_p: float = _neutral("top_p")
    top_k: int = _neutral("top_k")
    seed: int | None = _neutral("seed")  # None: drawn once per job and recorded
    min_p: float = _neutral("min_p")
    repetition_penalty: float = _neutral("repetition_penalty")
    repeat_last_n: int = _neutral("repeat_last_n")
    frequency_penalty: float = _neutral("frequency_penalty")
    presence_penalty: float = _neutral("presence_penalty")

    def __post_init__(self) -> None:
        for key, control in CONTROLS.items():
            value = getattr(self, key)
            if value is not None and not control.in_range(value):
                raise ValueError(f"{key} {control.rule()}, got {value!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether any penalty changes the logits (the step skips the work otherwise)."""
        return ((self.repetition_penalty != 1.0 and self.repeat_last_n != 0)
                or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0)

    @classmethod
    def coerce(cls, value: _SamplingLike | dict[str, Any] | None,
               model_defaults: dict[str, Any] | None = None) -> SamplingParams:
        """Accept ``SamplingParams``, the protocol's ``Sampling``, a map, or None (greedy).

        A field that is absent or None takes the neutral default above, unless the value
        asks for ``defaults: "model"``: then it takes ``model_defaults`` (the loaded
        model's chat defaults, :mod:`uniun.models.chat_defaults`) first.
        """
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            given = {k: value[k] for k in FIELDS if value.get(k) is not None}
            mode = value.get("defaults")
        else:
            given = {k: getattr(value, k) for k in FIELDS if getattr(value, k, None) is not None}
            mode = getattr(value, "defaults", None)
        if mode == "model" and model_defaults:
            given = {**{k: v for k, v in model_defaults.items() if k in FIELDS}, **given}
        typed: dict[str, Any] = {k: CONTROLS[k].typed(v) for k, v in given.items()}
        return cls(**typed)

    def to_map(self) -> dict[str, Any]:
        return asdict(self)


if tuple(f.name for f in fields(SamplingParams)) != KEYS:  # pragma: no cover
    raise ImportError("SamplingParams' fields differ from protocol/sampling_fields.py")


class Sampler:
    """Picks tokens for one job. Stateless apart from the job's seed (see module doc)."""

    def __init__(self, params: SamplingParams, seed: int | None = None) -> None:
        self.params = params
        # The effective seed: the asked one, else one drawn now. It goes into the job's
        # record so a resumed or recomputed job draws exactly the same numbers.
        if seed is None:
            seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.seed = int(seed)

    def pick(self, logits: np.ndarray, seq: int) -> int:
        """The token at generated position ``seq`` (0-based) given its logits [vocab]."""
        return sample_token(logits, self.params, self.seed, seq)


def _uniform(seed: int, seq: int) -> float:
    """One uniform draw in [0, 1) that depends only on (seed, seq)."""
    bits = np.random.Philox(key=seed & ((1 << 64) - 1), counter=seq)
    return float(np.random.Generator(bits).random())


def sample_token(logits: np.ndarray, params: SamplingParams, seed: int, seq: int) -> int:
    """Choose one token id from a 1-D logits vector."""
    logits = np.asarray(logits).reshape(-1)
    if params.greedy:
        return int(np.argmax(logits))
    with np.errstate(over="ignore"):
        scaled = logits.astype(np.float64) / params.temperature
    if not np.isfinite(scaled.max()):
        # A temperature so small (1e-308) that logits / T overflows: that is greedy, and
        # inf - inf would make every probability NaN (and pick token 0, masked or not).
        return int(np.argmax(logits))
    scaled -= scaled.max()
    vocab = scaled.shape[0]
    top_k = params.top_k if 0 < params.top_k < vocab else 0
    if params.min_p > 0.0:
        # min-p keeps what is within a factor of the top token: drop the rest outright
        # (in log space: scaled - max >= log(min_p)), before the other filters.
        scaled = np.where(scaled >= np.log(params.min_p), scaled, -np.inf)
    if top_k == 0 and params.top_p >= 1.0:
        # Plain temperature sampling: no sort needed, token-id order is already stable.
        candidates = None
        probs = np.exp(scaled)
    else:
        if top_k == 0:
            # Nucleus only: a full sort of a 50k vocabulary costs milliseconds per token,
            # so look at the 512 most likely first; the nucleus is almost always inside.
            shortlist = min(vocab, _NUCLEUS_SHORTLIST)
            total = np.exp(scaled).sum()
            candidates = np.argpartition(-scaled, shortlist - 1)[:shortlist]
            if np.exp(scaled[candidates]).sum() < params.top_p * total:
                candidates = np.arange(vocab)
        else:
            candidates = np.argpartition(-scaled, top_k - 1)[:top_k]
        # A stable order (by probability, then id) keeps the pick reproducible.
        order = np.lexsort((candidates, -scaled[candidates]))
        candidates = candidates[order]
        probs = np.exp(scaled[candidates])
        if params.top_p < 1.0:
            cumulative = np.cumsum(probs) / probs.sum()
            keep = int(np.searchsorted(cumulative, params.top_p, side="left")) + 1
            candidates = candidates[:keep]
            probs = probs[:keep]
    cumulative = np.cumsum(probs)
    index = int(np.searchsorted(cumulative, _uniform(seed, seq) * cumulative[-1], side="right"))
    index = min(index, len(cumulative) - 1)
    return int(index if candidates is None else candidates[index])


_NUCLEUS_SHORTLIST = 512
