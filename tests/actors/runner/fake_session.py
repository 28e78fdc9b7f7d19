"""A decoder session without a model, for unit tests of the runner's job bookkeeping.

:class:`FakeSession` stands where ``models/session.py``'s ``DecoderSession`` stands for
:class:`~uniun.actors.runner.jobs.RunnerJobs`: it starts, advances, parks, resumes and
recomputes real :class:`~uniun.models.generate.Generation` objects (so the limits, the
streamed text and the finish rules are the real ones) and fakes only the model's forward
pass: token ``seq`` of every job is id ``100 + seq`` with text ``"t<seq> "``, whatever
the prompt, the sampling or the seed. So a recompute continues exactly where a lost
runner stopped, and a test can name every token a job will stream. It keeps no KV: every
resume recomputes, in passes of ``max_tokens`` positions like the real session.

A prompt is one token per word (id 1, text ``"w "``); a prompt that does not fit
``max_positions`` is refused like the real session refuses it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from uniun.models.decoder_model import Interrupted
from uniun.models.generate import FinishedError, Generation, TokenEvent
from uniun.models.kv import JobProgress, ParkedState
from uniun.models.sampling import SamplingParams

__all__ = ["SEED", "FakeSession", "FakeTokenizer", "text_of", "texts", "token_id"]

FIRST_ID = 100  # id of a job's token 0
PROMPT_ID = 1  # every prompt word
SEED = 7  # the effective seed of a job that asked for none


def token_id(seq: int) -> int:
    """The id of token ``seq`` of any job."""
    return FIRST_ID + seq


def text_of(seq: int) -> str:
    """The text of token ``seq`` of any job."""
    return f"t{seq} "


def texts(n: int, start: int = 0) -> str:
    """The text of tokens ``start`` .. ``n - 1``."""
    return "".join(text_of(s) for s in range(start, n))


class FakeTokenizer:
    """Decodes the fake ids (what the real ``IncrementalDetokenizer`` calls)."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(text_of(i - FIRST_ID) if i >= FIRST_ID else "w " for i in ids)


class FakeSession:
    """See the module docstring. ``model_id``: the model it pretends to have loaded."""

    def __init__(self, model_id: str, *, max_positions: int = 512) -> None:
        self.model_id = model_id
        self.max_positions = max_positions
        self.tokenizer = FakeTokenizer()
        self.unloaded = False
        self.interrupt_next = False  # the next pass raises Interrupted (a pause came in)
        self.fail_next: Exception | None = None  # the next pass raises this (a model error)
        self.passes = 0  # forward passes "run": one per token, one per prefill chunk
        self._fed: weakref.WeakKeyDictionary[Generation, int] = weakref.WeakKeyDictionary()

    def unload(self) -> None:
        self.unloaded = True

    def interrupt(self) -> None:
        """Like the real session's: the pass in flight, or else the next one, aborts."""
        self.interrupt_next = True

    def clear_interrupt(self) -> None:
        self.interrupt_next = False

    def start(self, prompt: str | None = None, *,
              messages: Iterable[Mapping[str, Any]] | None = None,
              max_new_tokens: int = 128, sampling: Any = None, stop: Sequence[str] = (),
              job_id: str | None = None, format: Mapping[str, Any] | None = None
              ) -> Generation:
        """A new generation (``format`` is ignored: the fake tokens follow no grammar)."""
        words = (prompt or "").split() + [w for m in messages or () for w in
                                          str(m["content"]).split()]
        ids = [PROMPT_ID] * max(1, len(words))
        if len(ids) >= self.max_positions:
            raise ValueError(f"prompt of {len(ids)} tokens does not fit the model's "
                             f"{self.max_positions}-position context")
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        params = SamplingParams.coerce(sampling)
        progress = JobProgress(prompt_ids=ids, max_new_tokens=int(max_new_tokens),
                               sampling=params,
                               seed=params.seed if params.seed is not None else SEED,
                               stop=tuple(stop), job_id=job_id, model_id=self.model_id)
        return self._generation(progress)

    def advance(self, gen: Generation, max_tokens: int = 64) -> TokenEvent | None:
        """One pass of at most ``max_tokens`` uncovered positions (None), or the token."""
        gen.check_live()
        if self.interrupt_next:
            self.interrupt_next = False
            raise Interrupted()
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            raise err
        self.passes += 1
        fed = self._fed.get(gen, 0)
        if gen.progress.total_tokens - fed > max_tokens + 1:
            self._fed[gen] = fed + max_tokens
            return None
        return self._token(gen)

    def step(self, gen: Generation) -> TokenEvent:
        gen.check_live()
        self.passes += 1
        return self._token(gen)

    def park(self, gen: Generation) -> ParkedState:
        gen.check_live()
        gen.parked = True
        return ParkedState(gen.progress)

    def resume(self, parked: ParkedState) -> Generation:
        p = parked.progress
        if p.finished:
            raise FinishedError(f"job {p.job_id!r} already finished ({p.finish_reason})")
        if p.model_id and p.model_id != self.model_id:
            raise ValueError(f"job {p.job_id!r} was parked on model {p.model_id!r}, "
                             f"not {self.model_id!r}")
        parked.discard_spill()
        gen = self._generation(p)
        gen.recomputed_tokens = p.total_tokens - 1
        return gen

    def recompute(self, progress: JobProgress) -> Generation:
        if not progress.model_id:
            progress.model_id = self.model_id
        return self.resume(ParkedState(progress))

    def _generation(self, progress: JobProgress) -> Generation:
        return Generation(progress, self.tokenizer, max_positions=self.max_positions)

    def _token(self, gen: Generation) -> TokenEvent:
        event = gen.accept(token_id(len(gen.generated_ids)))
        self._fed[gen] = gen.progress.total_tokens - 1  # the new token is not fed yet
        return event
