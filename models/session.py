"""The decoder session: one ONNX decoder loaded, many jobs' KV states owned by the caller.

Theory of operation — the runner process owns one of these::

    session = DecoderSession.load(model_dir, threads=2)       # load_s, resident_bytes
    gen = session.start(messages=[...] | prompt="..." | prompt_ids=[...],
                        max_new_tokens=128, sampling=SamplingParams(...), stop=("\\n\\n",),
                        job_id="j1")
    while not gen.finished:
        ev = session.advance(gen, 64)   # one bounded pass (None) or ONE token per call:
        if ev is None: continue         #   check control messages between calls
        send(ev.seq, ev.text_delta)     # TokenEvent(seq, token_id, text_delta, finished, ...)
        if preempted:
            parked = session.park(gen)  # ParkedState: progress + KV (zero-copy), .nbytes
            break
    ...
    gen = session.resume(parked)        # continues exactly where it stopped (seq too)
    parked.evict_to_prefix(n) / parked.spill(path) / ParkedState.load(path)
    gen = session.recompute(record)     # from JobProgress.to_record() alone: re-prefill

The session is stateless between calls apart from the loaded model and the optional
:class:`~uniun.models.prefix_cache.PrefixCache`: every job's state lives in its
:class:`~uniun.models.generate.Generation` (live) or
:class:`~uniun.models.kv.ParkedState` (paused), which the caller holds. Batch size 1:
one job steps at a time, which is what a single-user device does.

This module is the *jobs* half of the decoder: loading ``model.onnx``, its I/O contract
and the forward pass itself are :class:`~uniun.models.decoder_model.DecoderModel`'s,
which the session extends; nothing here imports onnxruntime.

:meth:`DecoderSession.step` feeds whatever is uncovered (a long prompt, a replay) before
sampling; :meth:`DecoderSession.advance` does the same work one bounded pass per call,
so the caller stays responsive. How positions are cut into passes (so that resumes are
bit-exact) is ``feed_plan``'s job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from loguru import logger

from uniun.models.chat_defaults import chat_defaults
from uniun.models.chat_template import encode_chat, encode_prompt
from uniun.models.decoder_model import DecoderModel
from uniun.models.feed_plan import next_pass
from uniun.models.generate import FinishedError, Generation, TokenEvent
from uniun.models.kv import JobProgress, KVCache, ParkedState, SnapshotCorrupt
from uniun.models.logprobs import MAX_TOP_LOGPROBS
from uniun.models.prefix_cache import PrefixCache
from uniun.models.sampling import Sampler, SamplingParams

__all__ = ["MIN_CACHED_PREFIX", "DecoderSession", "FinishedError", "Generation", "TokenEvent"]

MIN_CACHED_PREFIX = 16  # static prefixes shorter than this (tokens) are not worth caching


class DecoderSession(DecoderModel):
    """A loaded decoder plus tokenizer; runs any number of jobs, one step at a time."""

    def __init__(self, model_dir: Path | str, *, threads: int = 2, model_id: str | None = None,
                 prefix_cache_bytes: int | None = None, spinning: bool = True,
                 replay: str = "auto", **model_options: Any) -> None:
        super().__init__(model_dir, threads=threads, model_id=model_id, spinning=spinning,
                         replay=replay, **model_options)
        # What a job with ``sampling.defaults == "model"`` takes for the fields it omits.
        self.chat_defaults = chat_defaults(self.model_id, self.model_dir)
        # None: the default cap; 0: no prefix cache at all.
        self.prefix_cache: PrefixCache | None = (
            PrefixCache() if prefix_cache_bytes is None
            else PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None)

    @classmethod
    def load(cls, model_dir: Path | str, threads: int = 2, **kwargs: Any) -> DecoderSession:
        """Load a model folder (``model.onnx``, ``config.json``, tokenizer files)."""
        return cls(model_dir, threads=threads, **kwargs)

    def unload(self) -> None:
        """Free the model and the prefix cache (the caller's parked states stay valid as data)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        super().unload()

    # -- jobs ------------------------------------------------------------------------------
    def encode(self, *, prompt: str | None = None,
               messages: Iterable[Mapping[str, Any] | Sequence[str]] | None = None,
               tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None
               ) -> tuple[list[int], int]:
        """Token ids and static-prefix length for a raw prompt or chat messages."""
        if (prompt is None) == (messages is None):
            raise ValueError("give exactly one of prompt or messages")
        if messages is not None:
            return encode_chat(self.tokenizer, messages, tools=tools, tool_choice=tool_choice)
        if tools and tool_choice != "none":
            raise ValueError("tools need chat messages, not a raw prompt")
        return encode_prompt(self.tokenizer, prompt), 0  # type: ignore[arg-type]

    def start(self, prompt: str | None = None, *,
              messages: Iterable[Mapping[str, Any] | Sequence[str]] | None = None,
              prompt_ids: Sequence[int] | None = None, max_new_tokens: int = 128,
              sampling: Any = None, stop: Sequence[str] = (), job_id: str | None = None,
              static_prefix: int | None = None, use_prefix_cache: bool = True,
              ignore_eos: bool = False, format: Mapping[str, Any] | None = None,
              logprobs: int | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
              tool_choice: Any = None, cache_prompt: bool = False) -> Generation:
        """A new generation (nothing runs yet; the first :meth:`step` prefills).

        Exactly one of ``prompt`` (raw text), ``messages`` (rendered with the chat
        template) or ``prompt_ids``. ``sampling``: :class:`SamplingParams`, the protocol's
        ``Sampling``, a map, or None (greedy). ``static_prefix`` overrides the detected
        system-prompt length (positions kept by partial eviction, shared by the cache).
        ``ignore_eos`` (benchmarks): run to ``max_new_tokens`` whatever the model says.
        ``format``: constrain the output (``models/constrain.py``), e.g.
        ``{"type": "json_schema", "schema": {...}}``. ``sampling`` with ``defaults:
        "model"`` fills what it leaves out from :attr:`chat_defaults`. ``logprobs``: each
        token's log-probability and this many alternatives (``TokenEvent.logprobs``).
        ``tools`` (``[{name, description?, parameters?}]``) with ``tool_choice``
        (``none``, ``auto`` (default), ``required``, ``{"name": ...}``): shown to the
        model and enforced by grammar (``models/tools.py``). ``cache_prompt``: the whole
        prompt is the static prefix, so jobs sent with the same prompt share its KV.
        """
        if prompt_ids is not None:
            if prompt is not None or messages is not None:
                raise ValueError("give exactly one of prompt, messages or prompt_ids")
            ids, static = [int(t) for t in prompt_ids], 0
            if not ids:
                raise ValueError("prompt_ids must not be empty")
        else:
            ids, static = self.encode(prompt=prompt, messages=messages, tools=tools,
                                      tool_choice=tool_choice)
            if not ids:  # some control characters tokenize to nothing
                raise ValueError("the prompt has no tokens for this model")
        if cache_prompt:
            static = len(ids)
        if tools and tool_choice != "none":
            format = {"type": "tools", "tools": [dict(t) for t in tools],
                      "choice": tool_choice or "auto",
                      **({"format": dict(format)} if format else {})}
        if logprobs is not None and not 0 <= int(logprobs) <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}]")
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.max_positions is not None and len(ids) >= self.max_positions:
            raise ValueError(f"prompt of {len(ids)} tokens does not fit the model's "
                             f"{self.max_positions}-position context")
        params = SamplingParams.coerce(sampling, self.chat_defaults)
        progress = JobProgress(
            prompt_ids=ids, max_new_tokens=int(max_new_tokens), sampling=params,
            seed=Sampler(params).seed, stop=tuple(stop), eos_ids=() if ignore_eos else self.eos_ids,
            static_prefix=max(0, min(static if static_prefix is None else int(static_prefix),
                                     len(ids) - 2)),
            job_id=job_id, model_id=self.model_id, format=dict(format) if format else None,
            logprobs=None if logprobs is None else int(logprobs))
        gen = self._generation(progress, None)
        if use_prefix_cache and self.prefix_cache is not None:
            n, kv = self.prefix_cache.lookup(ids)
            if kv is not None:
                gen.kv, gen.prefix_cache_tokens = kv, n
        gen.cache_prefix = use_prefix_cache
        return gen

    def _generation(self, progress: JobProgress, kv: KVCache | None) -> Generation:
        return Generation(progress, self.tokenizer, kv, max_positions=self.max_positions)

    def prefill(self, gen: Generation, max_tokens: int | None = None,
                max_passes: int | None = None) -> int:
        """Feed up to ``max_tokens`` uncovered positions (in at most ``max_passes`` forward
        passes) ahead of the next :meth:`step`; returns the positions fed, 0 when only
        the step's own pass is left.

        Optional: :meth:`step` feeds whatever is left. A caller that checks control
        messages during a long prompt or a recompute loops
        ``while session.prefill(gen, 64, max_passes=1): check_control()`` and then steps;
        each call then costs at most one 64-position pass or one decode-sized pass (in
        exact-replay mode generated tokens are re-fed one per pass). Crossing the static
        prefix puts its KV in the prefix cache.
        """
        gen.check_live()
        return self._feed(gen, for_step=False, budget=max_tokens, max_passes=max_passes)

    def step(self, gen: Generation) -> TokenEvent:
        """Feed the uncovered positions, sample ONE token, return what to stream."""
        gen.check_live()
        self._feed(gen, for_step=True)
        logits, gen.kv = self.forward(gen.pending_ids(), gen.kv)
        token, logprobs = gen.choose(logits)
        return gen.accept(token, logprobs)

    def advance(self, gen: Generation, max_tokens: int = 64) -> TokenEvent | None:
        """One bounded unit of work: a pass of a long prefill or of a replay (returns None,
        call again), or the step that samples the next token (returns its event).

        The runner's loop: ``ev = session.advance(gen)``; on None check control messages
        and call again. Each call costs at most one ``max_tokens``-position pass or one
        decode-sized pass, plus the step's own pass; a short prompt or a plain decode step
        takes exactly the passes :meth:`step` would.
        """
        gen.check_live()
        chunked = len(gen.pending_ids()) > max_tokens + 1
        if self._feed(gen, for_step=not chunked, budget=max_tokens, max_passes=1):
            return None
        return self.step(gen)

    def _feed(self, gen: Generation, *, for_step: bool, budget: int | None = None,
              max_passes: int | None = None) -> int:
        """Feed the passes :func:`next_pass` plans, up to ``budget`` positions."""
        fed = passes = 0
        p = gen.progress
        while (budget is None or fed < budget) and (max_passes is None or passes < max_passes):
            replaying = (p.total_tokens - len(p.prompt_ids) >= 1
                         and gen.kv_length < p.total_tokens - 1)
            plan = next_pass(kv_length=gen.kv_length, prompt_len=len(p.prompt_ids),
                             total=p.total_tokens, static_prefix=p.static_prefix,
                             cache_split=self._should_cache_prefix(gen),
                             exact=self.exact_replay if replaying else True, for_step=for_step,
                             budget=None if budget is None else budget - fed)
            if plan is None:
                break
            start, end = plan
            base = gen.kv
            if base is not None and start < gen.kv_length:
                base = base.prefix(start) if start > 0 else None
            # Assigned only after the pass: an interrupted pass leaves ``gen`` untouched.
            _, gen.kv = self.forward(p.all_ids[start:end], base)
            fed += end - start
            passes += 1
            self._maybe_cache_prefix(gen)
        return fed

    # -- prefix cache glue ----------------------------------------------------------------
    def _should_cache_prefix(self, gen: Generation) -> bool:
        return (self.prefix_cache is not None and gen.cache_prefix
                and gen.progress.static_prefix >= MIN_CACHED_PREFIX)

    def _maybe_cache_prefix(self, gen: Generation) -> None:
        p = gen.progress
        if (self._should_cache_prefix(gen) and gen.kv is not None
                and gen.kv.length == p.static_prefix
                and p.prompt_ids[: p.static_prefix] not in self.prefix_cache):  # type: ignore[operator]
            # A view of an in-place buffer would keep the whole buffer alive (and the cache
            # would under-count it): cache a compact copy of the prefix instead.
            kv = gen.kv.compact() if gen.kv.buffer is not None else gen.kv
            self.prefix_cache.put(p.prompt_ids[: p.static_prefix], kv)  # type: ignore[union-attr]

    def generate(self, gen: Generation) -> Iterable[TokenEvent]:
        """Step until finished (for callers that never pause, e.g. ``models run``)."""
        while not gen.finished:
            yield self.step(gen)

    # -- pause / resume --------------------------------------------------------------------
    def park(self, gen: Generation) -> ParkedState:
        """Pause a job: its progress and its KV (kept by reference, no copy) leave ``gen``.

        ``gen`` must not be stepped afterwards; :meth:`resume` the returned state instead.
        """
        gen.check_live()
        parked = ParkedState(gen.progress, gen.kv)
        gen.kv = None
        gen.parked = True
        return parked

    def resume(self, parked: ParkedState) -> Generation:
        """A live generation from a parked state: snapshot, partial KV, spill, or nothing."""
        p = parked.progress
        if p.finished:
            raise FinishedError(f"job {p.job_id!r} already finished ({p.finish_reason})")
        if p.model_id and p.model_id != self.model_id:
            raise ValueError(f"job {p.job_id!r} was parked on model {p.model_id!r}, "
                             f"not {self.model_id!r}")
        try:
            kv = parked.load_kv()
        except SnapshotCorrupt as exc:  # the progress is intact: recompute, lose nothing
            logger.bind(job=p.job_id).warning("spilled KV unusable ({}); recomputing", exc)
            kv = None
        if kv is not None and kv.shape != (self.num_layers, self.kv_heads, self.head_dim):
            raise ValueError(f"job {p.job_id!r}: parked KV shape {kv.shape} does not fit "
                             f"{self.model_id}")
        if kv is not None and kv.length >= p.total_tokens:
            kv = kv.prefix(p.total_tokens - 1)  # defensive: always leave a position to feed
        parked.discard_spill()
        parked.kv = None
        gen = self._generation(p, kv)
        gen.recomputed_tokens = p.total_tokens - 1 - gen.kv_length
        gen.cache_prefix = True
        if gen.kv is None and self.prefix_cache is not None:
            n, cached = self.prefix_cache.lookup(p.prompt_ids)
            if cached is not None:
                gen.kv, gen.prefix_cache_tokens = cached, n
                gen.recomputed_tokens = p.total_tokens - 1 - n
        logger.bind(job=p.job_id).debug("resumed at {} tokens, {} kept, {} to recompute",
                                        p.total_tokens, gen.kv_length, gen.recomputed_tokens)
        return gen

    def recompute(self, record: Mapping[str, Any] | JobProgress) -> Generation:
        """Resume from progress alone (e.g. a record kept by a restarted runner)."""
        progress = (record if isinstance(record, JobProgress)
                    else JobProgress.from_record(dict(record)))
        if not progress.model_id:
            progress.model_id = self.model_id
        return self.resume(ParkedState(progress))
