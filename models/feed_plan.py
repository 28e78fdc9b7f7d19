"""How the uncovered positions of a job are cut into forward passes — so resumes are exact.

Why this exists: onnxruntime's kernels need not compute a position the same way in a
one-position pass (a decode step) as in a many-position pass (a prefill). Where a
one-query pass takes another kernel path (the opset-23 ``Attention`` op does), int8
activation quantisation turns the difference into visibly different logits, while any
two *many*-position passes agree bit for bit. A resume that re-feeds generated tokens in
one batched pass would then recompute them slightly differently from the uninterrupted
run, and greedy decoding could drift. Our decoder graph stacks the query heads of each
KV head as rows, so every pass is a many-row pass and the two agree bit for bit; the
session's probe checks this for every model it loads, and a model where they disagree
(an imported one, say) still gets exact one-token replay.

The canonical cut, followed by every run and every replay alike:

* prompt positions are fed in passes of at least two positions (the prefill; split at the
  static prefix when it is cached), never leaving a single prompt position behind;
* each generated token is fed alone, in the decode step that follows its sampling.

The prompt rule holds in every mode. In ``exact`` mode a resume also replays the
generated tokens as they were fed: one per pass. That costs one decode step per generated token
to recompute; the session uses ``exact`` only when a probe shows the model's one- and
many-position passes disagree, and one batched pass otherwise.

Pure arithmetic on counts, no model here: a test can walk every case.
"""

from __future__ import annotations

__all__ = ["next_pass"]


def next_pass(*, kv_length: int, prompt_len: int, total: int, static_prefix: int,
              cache_split: bool, exact: bool, for_step: bool,
              budget: int | None = None) -> tuple[int, int] | None:
    """The next pass ``[start, end)`` to feed *before* the step's final pass, or None.

    ``for_step``: planning inside :meth:`DecoderSession.step` (its final pass, fed by the
    step itself, is the last generated token — or the prompt tail on a first step — or,
    when not ``exact``, everything). Otherwise planning a caller's chunked
    :meth:`DecoderSession.prefill` of at most ``budget`` positions, which must leave the
    final pass to the step. ``start < kv_length`` means: trim the KV to ``start`` first
    (a single leftover prompt position is widened to two, as the original run fed it).
    """
    a, p, t = kv_length, prompt_len, total
    generated = t - p
    if generated >= 1 and a < t - 1:
        limit = t - 1 if (exact or not for_step) else a
    elif for_step:
        limit = a
    else:
        limit = max(a, p - 2)  # a first step needs at least two prompt positions of its own
    split = static_prefix if cache_split and a + 2 <= static_prefix <= p - 2 else None
    if split is not None:
        limit = max(limit, split)
    if a >= limit:
        return None
    if a < p:  # the prompt region: passes of >= 2 positions, never leaving exactly one
        end = min(limit, p)
        if split is not None and a < split < end:
            end = split
        if budget is not None:
            end = min(end, a + max(budget, 2))
        if end < p and p - end == 1:
            end -= 1
        if end - a >= 2 or p == 1:
            return a, end
        if end == p and a == p - 1:
            return p - 2, p  # widen: recompute the last prompt position with its neighbour
        return None
    if exact:
        return a, a + 1
    end = limit if budget is None else min(limit, a + max(budget, 1))
    return a, end
