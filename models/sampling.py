"""Choosing the next token from logits: greedy, temperature, top-k, top-p, seeded.

Why a counter-based random stream: a job can be paused, spilled to disk, and resumed in
another runner process — or rebuilt from nothing but its token ids (recompute). If the
random draws came from a stateful generator, its state would have to travel with every
parked job and survive every path. Instead the draw for the token at position ``seq`` is
a pure function of ``(seed, seq)``: the only state is the seed, and "same seed, same text"
holds across any number of pauses and resumes.

``temperature == 0`` means greedy (argmax; ties go to the lowest token id), as on the wire
(PROTOCOL.md ``sampling``). ``top_k == 0`` and ``top_p == 1`` disable those filters.

No I/O and no onnxruntime here: the policy of choosing lives apart from the model.
"""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

__all__ = ["Sampler", "SamplingParams", "sample_token"]


class _SamplingLike(Protocol):
    temperature: float
    top_p: float
    top_k: int
    seed: int | None


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. Mirrors ``uniun.protocol.jobmap.Sampling`` (accepted too)."""

    temperature: float = 0.0  # 0 = greedy; > 0 divides the logits
    top_p: float = 1.0  # nucleus mass kept, (0, 1]; 1 = off
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    seed: int | None = None  # None: a random seed is drawn once per job and recorded

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0 and np.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def coerce(cls, value: _SamplingLike | dict[str, Any] | None) -> SamplingParams:
        """Accept ``SamplingParams``, the protocol's ``Sampling``, a map, or None (greedy)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls(**{k: value[k] for k in ("temperature", "top_p", "top_k", "seed") if k in value})
        return cls(float(value.temperature), float(value.top_p), int(value.top_k), value.seed)

    def to_map(self) -> dict[str, Any]:
        return asdict(self)


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
    return float(np.random.Generator(np.random.Philox(key=seed & ((1 << 64) - 1), counter=seq)).random())


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
