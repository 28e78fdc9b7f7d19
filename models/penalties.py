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

from collections import deque
from collections.abc import Sequence

import numpy as np

from uniun.models.sampling import SamplingParams
from uniun.models.sampling_ops import penalize

__all__ = ["Penalties"]

class _IdSet:
    """Distinct token ids with a count each, also kept as a numpy array of the ids (and of
    the counts) that grows in place: the step hands the arrays to C without building
    them from a dict every token."""

    def __init__(self) -> None:
        self.ids = np.empty(64, np.int64)
        self.counts = np.empty(64, np.float32)
        self.size = 0
        self._where: dict[int, int] = {}

    def __bool__(self) -> bool:
        return self.size > 0

    def add(self, token: int) -> None:
        at = self._where.get(token)
        if at is None:
            if self.size == self.ids.shape[0]:
                self.ids = np.concatenate([self.ids, np.empty_like(self.ids)])
                self.counts = np.concatenate([self.counts, np.empty_like(self.counts)])
            at = self._where[token] = self.size
            self.ids[at], self.counts[at] = token, 0.0
            self.size += 1
        self.counts[at] += 1.0

    def remove(self, token: int) -> None:
        """One occurrence less; the id leaves at zero (the last one takes its place)."""
        at = self._where[token]
        self.counts[at] -= 1.0
        if self.counts[at] > 0:
            return
        last = self.size - 1
        if at != last:
            moved = int(self.ids[last])
            self.ids[at], self.counts[at] = moved, self.counts[last]
            self._where[moved] = at
        del self._where[token]
        self.size = last


_NO_IDS = np.zeros(0, np.int64)
_NO_COUNTS = np.zeros(0, np.float32)


class Penalties:
    """One job's penalty state (see the module docstring)."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int],
                 generated_ids: Sequence[int] = ()) -> None:
        self.params = params
        n = params.repeat_last_n
        self._repeat = params.repetition_penalty != 1.0 and n != 0
        self._window_len = None if n < 0 else n
        self._window: deque[int] = deque()
        self._in_window = _IdSet()
        self._generated = _IdSet()
        self._rp = float(np.float32(params.repetition_penalty))
        self._freq = float(np.float32(params.frequency_penalty))
        self._pres = float(np.float32(params.presence_penalty))
        self._subtract = params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
        history = list(prompt_ids) + list(generated_ids)
        if self._repeat:
            start = 0 if self._window_len is None else max(0, len(history) - self._window_len)
            for token in history[start:]:
                self._push(int(token))
        if self._subtract:
            for token in generated_ids:
                self._generated.add(int(token))

    @property
    def active(self) -> bool:
        return self._repeat or self._subtract

    def _push(self, token: int) -> None:
        self._window.append(token)
        self._in_window.add(token)
        if self._window_len is not None and len(self._window) > self._window_len:
            self._in_window.remove(self._window.popleft())

    def accept(self, token: int) -> None:
        """Record a generated token (the next :meth:`apply` penalizes it)."""
        if self._repeat:
            self._push(int(token))
        if self._subtract:
            self._generated.add(int(token))

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """The penalized logits, float32. A writable float32 array is penalized in place
        and returned (the step's logits are the step's own: a copy of 200 KB per token is
        a tenth of a millisecond in a runner whose caches the forward pass just flushed);
        anything else is copied first."""
        if not self.active:
            return logits
        out = logits if logits.ndim == 1 else logits.reshape(-1)
        if out.dtype != np.float32 or not out.flags.writeable or not out.flags.c_contiguous:
            out = np.array(out, dtype=np.float32)
        w, g = self._in_window, self._generated
        penalize(out, w.ids[:w.size] if self._repeat else _NO_IDS, self._rp,
                 g.ids[:g.size] if self._subtract else _NO_IDS,
                 g.counts[:g.size] if self._subtract else _NO_COUNTS, self._freq, self._pres)
        return out
