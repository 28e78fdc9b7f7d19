"""Several generations decoded together: one forward pass feeds every decoding sequence.

Why: on a small CPU a decode step of one sequence leaves most of the weight-side work
unshared. Here up to ``size`` live :class:`~uniun.models.generate.Generation` s share each
step: their next tokens go through the model as rows of one pass (``input_ids`` [n, 1]),
each row with its own KV (a row of a :class:`~uniun.models.kv_pool.KVPool`), its own
position and its own length (``attention_mask`` row ``i`` opens that row's positions and
is zero after them), and each sequence samples and stops by its own rules.

**Bit-identical to running alone.** A sequence's tokens and logits do not depend on the
batch around it. Every op of the graphs we build computes a row from that row alone
(QMatMul quantises and accumulates each activation row on its own; norms, RoPE, SwiGLU
work per position; the attention ops read a row's keys at the positions that row alone
would have them, with the one-query path a decode step alone takes). Prefill is not
mixed into the batched pass: a joining sequence's prompt is fed in chunks on its own row,
through the session's own passes (``feed_plan``), between the others' decode steps, so
its passes are cut exactly as when it runs alone. ``tests/models/test_batch.py`` holds
this against single runs for random joins, leaves, parks and batch sizes.

**n > 1** (:meth:`DecodeBatch.join_group`): sequences with one prompt prefill it once;
the others wait, then take a copy of the prompt's KV and sample their first token from
the same logits with their own sampler.

A sequence in a batch is still an ordinary generation: :meth:`DecodeBatch.leave` hands it
back with its KV copied out of the row (it can step alone or join another batch), and
:meth:`DecodeBatch.park` gives what :meth:`DecoderSession.park` gives. While it is in
the batch its ``kv`` is a view of a row the batch reuses once it leaves: park it with
:meth:`DecodeBatch.park`, not ``session.park``, and keep no view of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from uniun.models.decoder_model import KV_CHUNK, Interrupted
from uniun.models.generate import Generation, TokenEvent
from uniun.models.kv import ParkedState
from uniun.models.kv_pool import KVPool
from uniun.models.session import DecoderSession

__all__ = ["DecodeBatch", "DEFAULT_PREFILL_CHUNK"]

DEFAULT_PREFILL_CHUNK = 64  # prompt positions fed per step for joining sequences (all of them)


class DecodeBatch:
    """Up to ``size`` generations of one session, advanced together by :meth:`step`."""

    def __init__(self, session: DecoderSession, size: int = 4, *,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> None:
        if not session.kv_in_place:
            raise ValueError(f"{session.model_id}: batched decoding needs a graph that writes "
                             "KV in place (GroupQueryAttention or GgmlAttention)")
        if prefill_chunk < 2:
            raise ValueError(f"prefill_chunk must be >= 2, not {prefill_chunk}")
        self.session = session
        self.size = int(size)
        self.prefill_chunk = int(prefill_chunk)
        self.pool = KVPool(session.num_layers, session.kv_heads, session.head_dim, self.size,
                           chunk=KV_CHUNK, max_positions=session.max_positions,
                           wrap=session._ort.OrtValue.ortvalue_from_numpy)
        self.members: list[Generation] = []  # row r of the pool is members[r]
        self._leader: dict[int, Generation] = {}  # id(follower) -> the leader it waits for
        self.batched_passes = 0  # passes with more than one row
        self.interrupted = False  # the last step ended early at an interrupted prefill pass
        self._bindings: dict[int, tuple[list[Any], Any]] = {}  # rows -> (pool values, IOBinding)

    # -- membership ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.members)

    @property
    def free(self) -> int:
        return self.size - len(self.members)

    def join(self, gen: Generation) -> None:
        """Add a live generation (from ``session.start`` or ``session.resume``); its KV, if
        it has any (a resume, a prefix-cache hit), is copied into its row."""
        self._check_joinable([gen])
        self._add(gen)

    def join_group(self, gens: list[Generation]) -> None:
        """Add generations of one prompt (``n > 1``): the first prefills it, the others
        wait and take a copy of its KV and its logits (each samples with its own seed)."""
        self._check_joinable(gens)
        lead = gens[0]
        for gen in gens[1:]:
            if gen.progress.prompt_ids != lead.progress.prompt_ids or gen.generated_ids \
                    or lead.generated_ids:
                raise ValueError("a group shares one prompt and has generated nothing yet")
        self._add(lead)
        for gen in gens[1:]:
            gen.kv = None  # a prefix-cache hit of its own is not needed: the leader's KV is
            self._add(gen)
            self._leader[id(gen)] = lead

    def _check_joinable(self, gens: list[Generation]) -> None:
        if len(gens) > self.free:
            raise ValueError(f"the batch has {self.free} free rows, not {len(gens)}")
        if len({id(g) for g in gens}) != len(gens):
            raise ValueError("a generation is named twice")
        for gen in gens:
            gen.check_live()
            if gen.progress.model_id and gen.progress.model_id != self.session.model_id:
                raise ValueError(f"job {gen.job_id!r} belongs to model {gen.progress.model_id!r}")
            if any(m is gen for m in self.members):
                raise ValueError(f"job {gen.job_id!r} is in the batch already")

    def _add(self, gen: Generation) -> None:
        self._grow_for(gen.kv_length + 1)
        self.members.append(gen)
        gen.kv = self.pool.load(len(self.members) - 1, gen.kv)

    def leave(self, gen: Generation) -> Generation:
        """Take ``gen`` out; it keeps a compact copy of its KV (none once finished), so it
        can step alone or join another batch. Followers waiting for it lead themselves."""
        r = self._row(gen)
        kv = gen.kv if gen.kv is not None and gen.kv.length > 0 and not gen.finished else None
        gen.kv = kv.compact() if kv is not None else None
        self._leader.pop(id(gen), None)
        followers = [m for m in self.members if self._leader.get(id(m)) is gen]
        for follower in followers:
            del self._leader[id(follower)]
        for follower in followers[1:]:
            self._leader[id(follower)] = followers[0]
        last = len(self.members) - 1
        if r != last:  # keep live rows [0, n): the last row moves into the hole
            self.pool.move(last, r)
            self.members[r] = self.members[last]
            moved = self.members[r]
            moved.kv = self.pool.view(r, self.pool.rows[r].written)
        else:
            self.pool.release(r)
        self.members.pop()
        return gen

    def park(self, gen: Generation) -> ParkedState:
        """Leave and park: the state :meth:`DecoderSession.park` gives (KV copied compact)."""
        return self.session.park(self.leave(gen))

    def _row(self, gen: Generation) -> int:
        for r, m in enumerate(self.members):
            if m is gen:
                return r
        raise ValueError(f"job {gen.job_id!r} is not in this batch")

    # -- the step --------------------------------------------------------------------------
    def step(self) -> dict[Generation, TokenEvent | None]:
        """One unit of work for every member: a token each for the decoding ones (one
        batched pass, first), then passes of their own for joining ones (in row order, until
        ``prefill_chunk`` positions were fed this step); None for a member with no token.

        Finished members leave at the end of the step (their KV is dropped). A pass cut
        short by ``session.interrupt()``: the batched pass raises
        :class:`~uniun.models.decoder_model.Interrupted` with nothing changed; a prefill
        pass ends the step there (what the step did so far is returned, and
        :attr:`interrupted` is True until the next step).
        """
        self.interrupted = False
        self._grow_for(max((g.progress.total_tokens for g in self.members), default=0) + 1)
        events: dict[Generation, TokenEvent | None] = {g: None for g in self.members}
        live = [r for r, g in enumerate(self.members)
                if not g.finished and id(g) not in self._leader]
        decoding = [r for r in live if len(self.members[r].pending_ids()) == 1]
        if decoding:
            self._decode(decoding, events)
        fed = 0  # each joining job's pass is cut as session.advance(gen, prefill_chunk) cuts
        for gen in [self.members[r] for r in live if r not in decoding]:
            if fed >= self.prefill_chunk:
                break
            try:
                fed += self._advance_alone(self._row(gen), gen, events)
            except Interrupted:
                self.interrupted = True
                break
        for gen in [g for g in self.members if g.finished]:
            self.leave(gen)
        return events

    def _grow_for(self, need: int) -> None:
        if self.pool.ensure(need):
            self.session.release_kv_binding()  # it may hold a row of the old block
            for r, gen in enumerate(self.members):
                gen.kv = self.pool.view(r, self.pool.rows[r].written)

    def _advance_alone(self, r: int, gen: Generation,
                       events: dict[Generation, TokenEvent | None]) -> int:
        """One pass of ``gen``'s own on its row, cut as ``session.advance(gen,
        prefill_chunk)`` cuts it alone (where a form's logits depend on how a prompt is cut,
        the same cut gives the same logits): a prefill chunk, or the prompt's final pass that
        samples (for it and its followers). Returns the positions fed."""
        s, budget = self.session, self.prefill_chunk
        chunked = len(gen.pending_ids()) > budget + 1
        fed = s._feed(gen, for_step=not chunked, budget=budget, max_passes=1)
        self._adopt(r, gen)
        if fed:
            return fed
        fed = s._feed(gen, for_step=True)  # what session.step feeds before its own pass
        self._adopt(r, gen)
        pending = gen.pending_ids()
        logits, gen.kv = s.forward(pending, gen.kv)
        self._adopt(r, gen)
        for follower in [m for m in self.members if self._leader.get(id(m)) is gen]:
            del self._leader[id(follower)]
            follower.kv = self.pool.load(self._row(follower), gen.kv)
            follower.prefix_cache_tokens = gen.prefix_cache_tokens
            events[follower] = follower.accept(*follower.choose(logits.copy()))
        events[gen] = gen.accept(*gen.choose(logits))
        return fed + len(pending)

    def _adopt(self, r: int, gen: Generation) -> None:
        """Keep ``gen``'s KV in its row: a pass that could not append there (the session
        trimmed the KV to re-feed a position) wrote a buffer of its own; copy it back."""
        row = self.pool.rows[r]
        if gen.kv is None:
            gen.kv = self.pool.load(r, None)
        elif gen.kv.buffer is not row:
            gen.kv = self.pool.load(r, gen.kv)

    def _decode(self, rows: list[int], events: dict[Generation, TokenEvent | None]) -> None:
        """One pass over rows ``[0, max(rows)]``: a token for each row in ``rows``; a row
        between them that is not decoding (a joining sequence, a follower) is fed a
        placeholder at its first free position, which nothing reads and its next pass
        overwrites."""
        s = self.session
        n = max(rows) + 1
        decoding = set(rows)
        lengths = [self.pool.rows[r].written for r in range(n)]
        ids = np.zeros((n, 1), np.int64)
        for r in rows:
            ids[r, 0] = self.members[r].progress.all_ids[-1]
        width = max(lengths) + 1
        mask = np.zeros((n, width), np.int64)
        for r, length in enumerate(lengths):
            mask[r, :length + 1] = 1
        binding = self._binding(n)
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("attention_mask", mask)
        binding.bind_cpu_input("position_ids", np.asarray(lengths, np.int64).reshape(n, 1))
        binding.bind_output("logits", "cpu")
        run_options = s._inflight = s._ort.RunOptions()
        try:
            s._sess.run_with_iobinding(binding, run_options)
        except Exception as err:
            if run_options.terminate:
                raise Interrupted(f"{s.model_id}: batched pass interrupted") from err
            raise
        finally:
            s._inflight = None
        s.passes += 1
        self.batched_passes += n > 1
        logits = binding.get_outputs()[0].numpy()
        for r in range(n):
            if r not in decoding:
                continue
            gen = self.members[r]
            self.pool.rows[r].written = lengths[r] + 1
            gen.kv = self.pool.view(r, lengths[r] + 1)
            events[gen] = gen.accept(*gen.choose(logits[r, -1].copy()))

    def _binding(self, n: int) -> Any:
        """The IOBinding of rows ``[0, n)`` as past and present (kept while the block is
        the same, so a step binds only the ids, the mask, the positions and the logits)."""
        values = self.pool.batch_values(n)
        cached = self._bindings.get(n)
        if cached is not None and cached[0] is values:
            return cached[1]
        s = self.session
        binding = s._sess.io_binding()
        binding.bind_output("logits", "cpu")  # first: get_outputs()[0] is the logits
        for name, out, value in zip(s._past_names, s._output_names[1:], values):
            binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(out, value)
        self._bindings[n] = (values, binding)
        return binding
