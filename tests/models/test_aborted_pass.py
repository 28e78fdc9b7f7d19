"""An aborted forward pass changes nothing: the job resumes to the uninterrupted tokens.

The runner aborts the active job's pass when a chat preempts it (``DecoderModel.interrupt``,
onnxruntime's ``RunOptions.terminate``). Our graphs write the KV in place, past the
positions a job keeps (docs/kv-cache.md), so an aborted pass can leave half-written
positions behind it. These tests abort passes at many points of a long prompt's prefill
and of the decode steps after it, both before a pass starts and while one runs, scribble
over the positions past the kept length as a half-done pass would, and check that the
job then goes on to exactly the greedy tokens of a run that was never interrupted.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.models_cache import shared_store
from uniun.models.convert.recipes import ensure_model
from uniun.models.decoder_model import Interrupted
from uniun.models.generate import Generation
from uniun.models.session import DecoderSession

# A prompt long enough for many passes of CHUNK positions (the tiny and SmolLM2
# tokenizers both give it well over 100 tokens).
PROMPT = " ".join(f"Item {i}: the lighthouse keeper counts the waves, slowly." for i in range(12))
CHUNK = 16
N = 12


def _scribble(gen: Generation) -> None:
    """NaN over every position past the kept length: what a half-finished in-place pass
    may leave there. A retried pass must write them before anything reads them."""
    kv = gen.kv
    if kv is not None and kv.buffer is not None:
        for array in kv.buffer.arrays:
            array[:, :, kv.buffer.written:, :] = np.nan


def _interrupt_in_flight(session: DecoderSession, returned: threading.Event
                         ) -> threading.Thread:
    """A thread that waits until a pass is running (or the call has returned), then
    interrupts (the runner's pump thread does this when a chat arrives). Whether the
    pass is still running when the flag lands or has just finished, exactly one pass
    aborts: that one, or the next."""
    def run() -> None:
        while session._inflight is None and not returned.is_set():
            time.sleep(0)
        session.interrupt()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _run(session: DecoderSession, *, before: set[int] = frozenset(),  # type: ignore[assignment]
         during: set[int] = frozenset()) -> tuple[list[int], int, int]:  # type: ignore[assignment]
    """Greedy tokens of PROMPT, advancing CHUNK positions per call; ``before``: calls
    interrupted before they start (with the spare KV scribbled over), ``during``: calls
    interrupted while their pass runs. Returns (tokens, prompt passes, aborts)."""
    gen = session.start(PROMPT, max_new_tokens=N, use_prefix_cache=False)
    tokens: list[int] = []
    call = prefill_calls = aborts = 0
    while not gen.finished:
        assert call < 10 * (len(gen.progress.prompt_ids) + N), "no progress"
        state = (gen.kv_length, list(gen.generated_ids))
        thread, returned = None, threading.Event()
        if call in before:
            _scribble(gen)
            session.interrupt()
        elif call in during:
            thread = _interrupt_in_flight(session, returned)
        try:
            ev = session.advance(gen, CHUNK)
        except Interrupted:
            aborts += 1
            assert (gen.kv_length, gen.generated_ids) == state, "an aborted pass moved the job"
            _scribble(gen)
            ev = None
        returned.set()
        if thread is not None:
            thread.join()
        if ev is None:
            prefill_calls += 1
        else:
            tokens.append(ev.token_id)
        call += 1
    return tokens, prefill_calls, aborts


@pytest.fixture(scope="module")
def tiny(tiny_model: str) -> DecoderSession:
    return DecoderSession.load(ensure_model(tiny_model, shared_store()), threads=1)


def test_abort_points_in_prefill_and_decode_leave_the_uninterrupted_tokens(
        tiny: DecoderSession) -> None:
    reference, passes, aborts = _run(tiny)
    assert aborts == 0 and passes >= 6, "the prompt should take several passes"
    last_prefill, first_decode = passes - 1, passes
    points = {0, passes // 2, last_prefill, first_decode, first_decode + 5}
    tokens, _, aborts = _run(tiny, before=points)
    assert aborts == len(points)
    assert tokens == reference


def test_passes_interrupted_while_they_run_leave_the_uninterrupted_tokens(
        tiny: DecoderSession) -> None:
    reference, passes, _ = _run(tiny)
    # Every other call, from the first prefill pass to the last decode steps; the last
    # call is spared so that every interrupt has a pass to take.
    points = set(range(0, passes + N - 2, 2))
    tokens, _, aborts = _run(tiny, during=points)
    assert aborts == len(points)
    assert tokens == reference


def test_an_interrupt_between_passes_aborts_the_next_pass_only(tiny: DecoderSession) -> None:
    gen = tiny.start(PROMPT, max_new_tokens=2, use_prefix_cache=False)
    tiny.interrupt()  # no pass in flight: the next one takes it
    with pytest.raises(Interrupted):
        tiny.advance(gen, CHUNK)
    assert gen.kv_length == 0
    assert tiny.advance(gen, CHUNK) is None and gen.kv_length == CHUNK  # one abort, not two
    tiny.interrupt()
    tiny.clear_interrupt()  # withdrawn (the runner does this when a new job starts)
    assert tiny.advance(gen, CHUNK) is None and gen.kv_length == 2 * CHUNK


def test_smollm2_resumes_an_aborted_prefill_and_decode_to_the_same_text(smollm2: str) -> None:
    session = DecoderSession.load(ensure_model(smollm2, shared_store()), threads=2)
    reference, passes, _ = _run(session)
    tokens, _, aborts = _run(session, before={1, passes - 1, passes + 2},
                             during={passes // 2, passes + 4})
    assert aborts == 5
    assert tokens == reference
