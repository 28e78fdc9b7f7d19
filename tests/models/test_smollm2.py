"""The real SmolLM2-135M-Instruct through the decoder session: right answers, exact resumes."""

from __future__ import annotations

import pytest

from tests.models_cache import shared_store
from uniun.models.convert.recipes import ensure_model
from uniun.models.kv import ParkedState
from uniun.models.session import DecoderSession

pytestmark = pytest.mark.smollm2

MESSAGES = [{"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
            {"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def session(smollm2: str) -> DecoderSession:
    return DecoderSession.load(ensure_model(smollm2, shared_store()), threads=2)


def test_answers_a_plain_factual_question(session: DecoderSession) -> None:
    # Chosen by trying: greedy SmolLM2-135M answers this with a clear margin at every token
    # (its first token for "capital of France?" is a near-tie, 0.08 logits in float32).
    gen = session.start(messages=[{"role": "user", "content": "What is the capital of Japan?"}],
                        max_new_tokens=32)
    streamed = "".join(e.text_delta for e in session.generate(gen))
    assert "Tokyo" in streamed
    assert streamed == gen.text
    assert gen.finish_reason == "stop"  # it ended on <|im_end|>, not on the token limit


def test_pause_and_resume_every_way_yields_the_uninterrupted_tokens(session: DecoderSession,
                                                                    tmp_path) -> None:
    n, pause_at = 24, 9
    session.prefix_cache.clear()
    gen = session.start(messages=MESSAGES, max_new_tokens=n, ignore_eos=True)
    reference = [e.token_id for e in session.generate(gen)]
    reference_text = gen.text
    assert len(set(reference)) > 8

    def evict(p: ParkedState) -> ParkedState:
        assert p.evict_to_prefix() > 0 and p.kv_length == p.progress.static_prefix > 10
        return p

    def spill(p: ParkedState) -> ParkedState:
        return ParkedState.load(p.spill(tmp_path / "job.kvsnap"))

    def drop(p: ParkedState) -> ParkedState:
        session.prefix_cache.clear()
        return ParkedState.from_record(p.progress.to_record())

    for shed in (None, evict, spill, drop):
        gen = session.start(messages=MESSAGES, max_new_tokens=n, ignore_eos=True)
        events = [session.step(gen) for _ in range(pause_at)]
        parked = session.park(gen)
        resumed = session.resume(shed(parked) if shed else parked)
        events += list(session.generate(resumed))
        name = shed.__name__ if shed else "snapshot"
        assert [e.token_id for e in events] == reference, name
        assert [e.seq for e in events] == list(range(n)), name
        assert resumed.text == reference_text, name


def test_a_prompt_that_tokenizes_to_nothing_is_refused_at_start(session: DecoderSession
                                                                 ) -> None:
    """SmolLM2's tokenizer drops some control characters: a raw prompt of only those has
    no tokens, which the decoder cannot run (it failed mid-step before)."""
    assert session.encode(prompt="\x04\x06")[0] == []
    with pytest.raises(ValueError, match="no tokens"):
        session.start("\x04\x06", max_new_tokens=2)
