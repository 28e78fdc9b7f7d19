"""Penalties on repeated tokens: llama.cpp's ``repeat_penalty`` and OpenAI's frequency and
presence penalties, applied to the logits before anything else chooses from them.

Semantics (docs/protocol.md ``sampling``):

* ``repetition_penalty`` r over the last ``repeat_last_n`` ids of prompt + generated (the
  window llama.cpp's server and CLI use: they feed the prompt to the sampler before the
  first token): every token in the window, however often, has its logit divided by r if
  it is positive and multiplied by r otherwise. ``repeat_last_n`` -1 means the whole
  history, 0 turns the penalty off.
* ``frequency_penalty`` f and ``presence_penalty`` p as OpenAI defines them: a token the
  job has generated c times (the prompt does not count) loses ``c * f + p`` from its
  logit.

Where both apply to a token, the repetition penalty comes first, then the subtraction:
llama.cpp's order. The arithmetic is float32, one rounding per operation as llama.cpp's
C does, so greedy text with a repetition penalty is llama.cpp's bit for bit wherever the
logits are.

State: counts of the window and of the generated ids, kept incrementally (a step costs
a few microseconds whatever the history's length). The state is a pure function of the
job's token ids, which every parked state carries (``JobProgress``): a resumed,
spilled-and-reloaded or recomputed job rebuilds it from them and penalizes exactly as the
uninterrupted run did.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

import numpy as np

from uniun.models.sampling import SamplingParams

__all__ = ["Penalties"]


class Penalties:
    """One job's penalty state (see the module docstring)."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int],
                 generated_ids: Sequence[int] = ()) -> None:
        self.params = params
        n = params.repeat_last_n
        self._repeat = params.repetition_penalty != 1.0 and n != 0
        self._window_len = None if n < 0 else n
        self._window: deque[int] = deque()
        self._in_window: Counter[int] = Counter()
        self._generated: Counter[int] = Counter()
        self._rp = np.float32(params.repetition_penalty)
        self._freq = np.float32(params.frequency_penalty)
        self._pres = np.float32(params.presence_penalty)
        self._subtract = params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
        history = list(prompt_ids) + list(generated_ids)
        if self._repeat:
            start = 0 if self._window_len is None else max(0, len(history) - self._window_len)
            for token in history[start:]:
                self._push(int(token))
        if self._subtract:
            self._generated.update(int(t) for t in generated_ids)

    @property
    def active(self) -> bool:
        return self._repeat or self._subtract

    def _push(self, token: int) -> None:
        self._window.append(token)
        self._in_window[token] += 1
        if self._window_len is not None and len(self._window) > self._window_len:
            old = self._window.popleft()
            self._in_window[old] -= 1
            if not self._in_window[old]:
                del self._in_window[old]

    def accept(self, token: int) -> None:
        """Record a generated token (the next :meth:`apply` penalizes it)."""
        if self._repeat:
            self._push(int(token))
        if self._subtract:
            self._generated[int(token)] += 1

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """The penalized logits: a new float32 array (``logits`` is never written)."""
        if not self.active:
            return logits
        out = np.array(logits, dtype=np.float32, copy=True).reshape(-1)
        if self._repeat and self._in_window:
            ids = np.fromiter(self._in_window, dtype=np.int64, count=len(self._in_window))
            ids = ids[ids < out.shape[0]]
            values = out[ids]
            out[ids] = np.where(values <= 0, values * self._rp, values / self._rp)
        if self._subtract and self._generated:
            ids = np.fromiter(self._generated, dtype=np.int64, count=len(self._generated))
            counts = np.fromiter(self._generated.values(), dtype=np.float32,
                                 count=len(self._generated))
            keep = ids < out.shape[0]
            ids, counts = ids[keep], counts[keep]
            out[ids] -= counts * self._freq + np.float32(1.0) * self._pres
        return out
