"""Log-probabilities of the chosen token and of the most likely alternatives.

Which distribution: the one the sampler chose from, before truncation. That is the
model's logits after the grammar mask (structured output and tool calls: a token the
grammar forbids has probability 0) and after the repetition, frequency and presence
penalties, at temperature 1, before top-k, top-p and min-p cut it down. vLLM reports
this "processed" distribution too; it makes the first alternative exactly the token a
greedy job picks (ties go to the lowest id in both), and it does not depend on how a
sampled job was tempered.

Cost: one pass for the ``k`` most likely (``models/sampling_ops.c``) and one log-sum-exp
over the vocabulary per token; ``bench --dialect`` measures it inside real decode steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from uniun.models.sampling_ops import top_k

__all__ = ["MAX_TOP_LOGPROBS", "Shown", "TokenLogprobs", "logprobs_record", "token_logprobs",
           "token_shower"]

MAX_TOP_LOGPROBS = 20  # OpenAI's cap on top_logprobs


@dataclass(frozen=True)
class TokenLogprobs:
    """The chosen token's log-probability and the ``k`` most likely ids, best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: np.ndarray, token_id: int, k: int,
                   work: np.ndarray | None = None, *, ids: np.ndarray | None = None,
                   token_is_max: bool = False) -> TokenLogprobs:
    """Natural-log probabilities from ``logits`` (1-D), for ``token_id`` and the top ``k``.

    The order of ``top``: by probability, then by lowest id, so ``top[0]`` is
    ``argmax(logits)``, the greedy pick. Fewer than ``k`` when fewer tokens are allowed.
    ``work``: a float32 buffer of the vocabulary's size to compute in; it may be
    ``logits`` itself, which is then overwritten (the step's own logits, used for nothing
    after this: the cheapest, no other 200 KB through the caches per token). ``ids``: the
    top ``k`` ids if the caller has them already (:func:`top_k`); ``token_is_max``: the
    token is the argmax (a greedy pick), so no search for the maximum is needed.
    """
    row = logits
    if not (row.dtype == np.float32 and row.ndim == 1 and row.flags.c_contiguous):
        row = np.ascontiguousarray(np.asarray(logits, dtype=np.float32).reshape(-1))
    if ids is None and k > 0:
        ids = top_k(row, int(k))
    if ids is not None and ids.shape[0]:
        peak = row[ids[0]]
    else:
        peak = row[token_id] if token_is_max else row.max()
    picked = float(row[token_id])  # read before ``work`` (maybe ``row``) is written
    top_ids = ids.tolist() if ids is not None and k > 0 else []
    top_values = row[ids].tolist() if top_ids else []
    # float32 throughout (a fifth of float64's cost over a 49k vocabulary): every term is
    # in (0, 1] after the shift and numpy sums pairwise, so log_total is good to ~1e-6.
    shifted = work if work is not None and work.shape == row.shape else None
    shifted = np.subtract(row, peak, out=shifted)
    base = float(peak) + math.log(float(np.exp(shifted, out=shifted).sum()))
    chosen = picked - base
    if not top_ids:
        return TokenLogprobs(int(token_id), chosen)
    # A token the grammar forbids (-inf) is no alternative: it is left out, not listed
    # with a log-probability JSON cannot even write.
    top = tuple((i, v - base) for i, v in zip(top_ids, top_values) if math.isfinite(v))
    return TokenLogprobs(int(token_id), chosen, top)


Shown = Callable[[int], tuple[str, list[int]]]  # a token id -> its text and its bytes


def token_shower(token_bytes: Callable[[int], bytes], cap: int = 65_536) -> Shown:
    """A token id's text and byte list, made once per id and kept (up to ``cap`` ids):
    a job asks for ~21 of them per token, mostly the same few hundred ids. One per
    tokenizer (the runner keeps one per loaded model)."""
    kept: dict[int, tuple[str, list[int]]] = {}

    def shown(token: int) -> tuple[str, list[int]]:
        found = kept.get(token)
        if found is None:
            raw = token_bytes(token)
            found = (raw.decode("utf-8", errors="replace"), list(raw))
            if len(kept) < cap:
                kept[token] = found
        return found

    return shown


def logprobs_record(lp: TokenLogprobs, shown: Shown) -> list[Any]:
    """The runner's compact form for the scheduler: ``[text, bytes, logprob, [[text,
    bytes, logprob], ...]]``. Compact because it is built in the decode loop, where each
    Python object costs; :func:`expand_logprobs` (the scheduler's side, ``protocol``) makes
    the event's shape from it."""
    text, raw = shown(lp.token_id)
    return [text, raw, lp.logprob, [(*shown(i), v) for i, v in lp.top]]
