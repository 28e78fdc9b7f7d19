"""One job's generation, token by token: the bookkeeping half of the decoder session.

A :class:`Generation` holds a job's :class:`~uniun.models.kv.JobProgress` (ids, text
streamed, limits), its live KV and its detokeniser. It knows nothing of onnxruntime:
:class:`~uniun.models.session.DecoderSession` runs the model and hands each sampled token
to :meth:`Generation.accept`, which decides what text is now safe to stream and whether
the job is finished (EOS, a stop string, ``max_new_tokens``, the model's context limit).

Invariant (what makes pause/resume exact): between steps, the KV covers positions
``[0, kv_length)`` of ``prompt_ids + generated_ids`` and at least one position is not
covered yet. A step feeds every uncovered position in one forward pass — the whole prompt
on the first step, one token afterwards, the dropped tail after a partial eviction,
everything after a recompute — samples from the last position's logits and appends the
token. So a parked job needs no logits, and a restored full snapshot continues with
exactly the computation an uninterrupted run would have done.

``seq`` of a :class:`TokenEvent` is the 0-based index of the token among the job's
generated tokens: gap-free and never repeated across any number of pauses, because the
generated ids travel with the job. The EOS token that ends a job gets an event too
(``token_id`` = the EOS id, text only what was still held back, ``finished=True``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from loguru import logger

from uniun.models.constrain import Constraint
from uniun.models.detokenize import IncrementalDetokenizer, StopMatcher
from uniun.models.kv import JobProgress, KVCache
from uniun.models.logprobs import TokenLogprobs, token_logprobs
from uniun.models.penalties import Penalties
from uniun.models.sampling import Sampler
from uniun.models.sampling_ops import top_k

__all__ = ["TokenEvent", "Generation", "FinishedError"]


class FinishedError(RuntimeError):
    """``step`` was called on a generation that has already finished (or was parked)."""


@dataclass(frozen=True)
class TokenEvent:
    """What one step produced. ``text_delta`` may be '' (unfinished character, held text)."""

    seq: int
    token_id: int
    text_delta: str
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" once finished
    logprobs: TokenLogprobs | None = None  # for a job that asked (JobProgress.logprobs)


class Generation:
    """A job being generated (live: its KV belongs to it until it is parked)."""

    def __init__(self, progress: JobProgress, tokenizer: Any, kv: KVCache | None = None,
                 *, max_positions: int | None = None) -> None:
        self.progress = progress
        self.kv: KVCache | None = kv if kv is not None and kv.length > 0 else None
        self.sampler = Sampler(progress.sampling, progress.seed)
        self.max_positions = max_positions
        self._stop = StopMatcher(progress.stop)
        self._detok = IncrementalDetokenizer(tokenizer, progress.prompt_ids)
        self._detok.replay(progress.generated_ids)
        if not self._detok.text.startswith(progress.text):
            # The streamed text is the truth the client holds; keep it, warn loudly.
            logger.bind(job=progress.job_id).warning(
                "replayed text differs from the text already streamed; continuing after it")
        self._released = len(progress.text)
        # A job with a format samples from masked logits (the grammar state is rebuilt
        # by replaying the generated ids, so pause/resume stays exact).
        self.constraint: Constraint | None = (
            Constraint(progress.format, tokenizer, progress.eos_ids, progress.generated_ids)
            if progress.format else None)
        # Penalties depend on the token history, rebuilt here from the ids the progress
        # carries: a resumed job penalizes exactly as the uninterrupted one did.
        self.penalties: Penalties | None = (
            Penalties(progress.sampling, progress.prompt_ids, progress.generated_ids)
            if progress.sampling.penalized else None)
        # Counters for the caller's accounting (tokens fed through the model, by cause).
        self.prefix_cache_tokens = 0  # prompt positions taken from the prefix cache
        self.recomputed_tokens = 0  # positions fed again on resume (eviction/recompute)
        self.cache_prefix = False  # put the static prefix's KV in the session's prefix cache
        self.parked = False  # set by DecoderSession.park: the state now lives elsewhere
        self._work: np.ndarray | None = None  # the log-probabilities' scratch buffer

    # -- views ----------------------------------------------------------------------
    @property
    def job_id(self) -> str | None:
        return self.progress.job_id

    @property
    def finished(self) -> bool:
        return self.progress.finished

    @property
    def finish_reason(self) -> str | None:
        return self.progress.finish_reason

    @property
    def generated_ids(self) -> list[int]:
        return self.progress.generated_ids

    @property
    def text(self) -> str:
        """All text streamed so far."""
        return self.progress.text

    @property
    def kv_length(self) -> int:
        return self.kv.length if self.kv is not None else 0

    def pending_ids(self) -> list[int]:
        """The positions a step will feed (never empty for an unfinished generation)."""
        return self.progress.all_ids[self.kv_length:]

    def to_record(self) -> dict[str, Any]:
        """Session-independent state (msgpack/JSON-safe): enough to resume by recompute."""
        return self.progress.to_record()

    def check_live(self) -> None:
        if self.parked:
            raise FinishedError(f"job {self.job_id!r} was parked; resume its ParkedState")
        if self.progress.finished:
            raise FinishedError(f"job {self.job_id!r} already finished ({self.finish_reason})")

    # -- the step's bookkeeping --------------------------------------------------------
    def choose(self, logits: np.ndarray) -> tuple[int, TokenLogprobs | None]:
        """The next token from the model's logits: the grammar's mask, the penalties,
        then the sampler; and its log-probabilities if the job asked (models/logprobs.py:
        from the same processed logits, before truncation)."""
        if self.constraint is not None:  # structured output: only what the grammar allows
            logits = self.constraint.mask(logits)
        if self.penalties is not None:
            logits = self.penalties.apply(logits)
        k = self.progress.logprobs
        greedy = self.sampler.params.greedy
        ids = top_k(logits, k) if k and greedy else None  # its first is the greedy pick
        token = (int(ids[0]) if ids is not None and ids.shape[0]
                 else self.sampler.pick(logits, len(self.progress.generated_ids)))
        if k is None:
            return token, None
        work = logits  # the step's own, used for nothing after this: computed in place
        if not (logits.dtype == np.float32 and logits.ndim == 1 and logits.flags.writeable
                and logits.flags.c_contiguous):
            if self._work is None or self._work.shape[0] != logits.shape[-1]:
                self._work = np.empty(logits.shape[-1], np.float32)  # reused every step
            work = self._work
        return token, token_logprobs(logits, token, k, work, ids=ids, token_is_max=greedy)

    def accept(self, token_id: int, logprobs: TokenLogprobs | None = None) -> TokenEvent:
        """Record a sampled token; decide the text to stream and whether we are done."""
        p = self.progress
        self.check_live()
        if p.finished:
            raise FinishedError(f"job {p.job_id!r} already finished ({p.finish_reason})")
        seq = len(p.generated_ids)
        if self.constraint is not None:
            self.constraint.consume(token_id)
        if self.penalties is not None:
            self.penalties.accept(token_id)
        p.generated_ids.append(int(token_id))
        reason: str | None = None
        if token_id in p.eos_ids:
            logprobs = None  # the end is no token of the text (as OpenAI lists them)
            self._detok.flush()
            end = len(self._detok.text)
            reason = "stop"
        else:
            self._detok.push(token_id)
            text = self._detok.text
            hit = self._stop.find(text, self._released) if self._stop.stop else -1
            if hit >= self._released:
                end, reason = hit, "stop"
            elif len(p.generated_ids) >= p.max_new_tokens or (
                    self.max_positions is not None and p.total_tokens >= self.max_positions):
                self._detok.flush()
                end, reason = len(self._detok.text), "length"
                hit = self._stop.find(self._detok.text, self._released) if self._stop.stop else -1
                if hit >= self._released:
                    end, reason = hit, "stop"
            else:
                end = self._stop.safe_length(text) if self._stop.stop else len(text)
                end = max(end, self._released)
        delta = self._detok.text[self._released:end]
        self._released = max(self._released, end)
        p.text += delta
        if reason is not None:
            p.finished, p.finish_reason = True, reason
        return TokenEvent(seq, int(token_id), delta, reason is not None, reason, logprobs)
