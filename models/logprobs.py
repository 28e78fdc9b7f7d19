"""Log-probabilities of the chosen token and of the most likely alternatives.

Which distribution: the one the sampler chose from, before truncation. That is the
model's logits after the grammar mask (structured output and tool calls: a token the
grammar forbids has probability 0) and after the repetition, frequency and presence
penalties, at temperature 1, before top-k, top-p and min-p cut it down. vLLM reports
this "processed" distribution too; it makes the first alternative exactly the token a
greedy job picks (ties go to the lowest id in both), and it does not depend on how a
sampled job was tempered.

Cost: one log-sum-exp over the vocabulary and, with alternatives, one partial sort of
``k`` entries: about a tenth of a millisecond for a 49k vocabulary (``bench``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MAX_TOP_LOGPROBS", "TokenLogprobs", "logprobs_map", "token_logprobs"]

MAX_TOP_LOGPROBS = 20  # OpenAI's cap on top_logprobs


@dataclass(frozen=True)
class TokenLogprobs:
    """The chosen token's log-probability and the ``k`` most likely ids, best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: np.ndarray, token_id: int, k: int) -> TokenLogprobs:
    """Natural-log probabilities from ``logits`` (1-D), for ``token_id`` and the top ``k``.

    The order of ``top``: by probability, then by lowest id, so ``top[0]`` is
    ``argmax(logits)``, the greedy pick. Fewer than ``k`` when fewer tokens are allowed.
    """
    row = np.asarray(logits, dtype=np.float32).reshape(-1)
    peak = row.max()
    # exp in float32 (a fifth of float64's cost over a 49k vocabulary), summed in float64:
    # every term is in (0, 1] after the shift, so the float32 rounding is relative 6e-8.
    log_total = float(np.log(np.exp(row - peak).sum(dtype=np.float64)))

    def logprob(i: int) -> float:
        return float(np.float64(row[i]) - np.float64(peak)) - log_total

    chosen = logprob(token_id)
    if k <= 0:
        return TokenLogprobs(int(token_id), chosen)
    n = row.shape[0]
    k = min(int(k), n)
    candidates = np.argpartition(row, n - k)[n - k:] if k < n else np.arange(n)
    # Ties at the cut: argpartition may keep any of the tied ids; the lowest ones win.
    cut = row[candidates].min()
    above = candidates[row[candidates] > cut]
    tied = np.flatnonzero(row == cut)
    candidates = np.concatenate([above, tied[: k - above.shape[0]]])
    order = np.lexsort((candidates, -row[candidates]))
    # A token the grammar forbids (-inf) is no alternative: it is left out, not listed
    # with a log-probability JSON cannot even write.
    top = tuple((int(i), logprob(int(i))) for i in candidates[order] if np.isfinite(row[i]))
    return TokenLogprobs(int(token_id), chosen, top)


def logprobs_map(lp: TokenLogprobs, token_bytes: Callable[[int], bytes]) -> dict[str, Any]:
    """The wire shape (docs/protocol.md, the ``token`` event's ``logprobs``; OpenAI's
    ``logprobs.content`` item): each token as text and as bytes, its log-probability."""
    def entry(token: int, logprob: float) -> dict[str, Any]:
        raw = token_bytes(token)
        return {"token": raw.decode("utf-8", errors="replace"), "bytes": list(raw),
                "logprob": logprob}

    out = entry(lp.token_id, lp.logprob)
    out["top_logprobs"] = [entry(token, logprob) for token, logprob in lp.top]
    return out
