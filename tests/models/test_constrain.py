"""Constrained decoding (models/constrain.py) on the tiny decoder: the mask holds at every
step, and pause/resume -- from a snapshot, after a partial eviction, or by recompute from
the record alone -- continues with exactly the tokens of an uninterrupted run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.models_cache import shared_store
from uniun.models.constrain import Constraint, FormatError, apply_bitmask, check_format
from uniun.models.session import DecoderSession

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "tags", "n"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "schema": SCHEMA}
SAMPLED = {"temperature": 0.9, "top_p": 0.95, "seed": 7}


@pytest.fixture(scope="module")
def session(tiny_model: str) -> DecoderSession:
    return DecoderSession.load(shared_store().path(tiny_model), threads=1,
                               prefix_cache_bytes=0)


def _run(session: DecoderSession, *, sampling: dict | None = None, max_new: int = 200) -> list[int]:
    gen = session.start("hello world", max_new_tokens=max_new, sampling=sampling, format=FORMAT)
    list(session.generate(gen))
    return list(gen.generated_ids)


def test_constrained_output_follows_the_schema(session: DecoderSession) -> None:
    """Random weights write gibberish, but the mask makes it valid JSON of the schema."""
    import jsonschema

    for sampling in (None, SAMPLED):
        gen = session.start("hello world", max_new_tokens=200, sampling=sampling, format=FORMAT)
        list(session.generate(gen))
        assert gen.finish_reason == "stop", gen.text
        jsonschema.validate(json.loads(gen.text), SCHEMA)
        assert gen.constraint is not None and gen.constraint.masks == len(gen.generated_ids)


def test_unconstrained_tiny_model_is_not_json(session: DecoderSession) -> None:
    """The control: the same prompt without a format does not produce that JSON."""
    gen = session.start("hello world", max_new_tokens=40)
    list(session.generate(gen))
    with pytest.raises(ValueError):
        json.loads(gen.text)


@pytest.mark.parametrize("sampling", [None, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("how", ["snapshot", "partial", "recompute"])
def test_pause_resume_keeps_the_grammar_state_exact(session: DecoderSession, how: str,
                                                    sampling: dict | None) -> None:
    reference = _run(session, sampling=sampling)
    assert len(reference) > 12
    gen = session.start("hello world", max_new_tokens=200, sampling=sampling, format=FORMAT)
    for _ in range(9):
        session.step(gen)
    parked = session.park(gen)
    if how == "snapshot":
        resumed = session.resume(parked)
    elif how == "partial":
        parked.evict_to_prefix(4)
        resumed = session.resume(parked)
    else:
        resumed = session.recompute(json.loads(json.dumps(parked.progress.to_record())))
    list(session.generate(resumed))
    assert resumed.generated_ids == reference
    assert resumed.constraint is not None


def test_json_object_format_gives_an_object(session: DecoderSession) -> None:
    gen = session.start("hello world", max_new_tokens=300, format={"type": "json_object"})
    list(session.generate(gen))
    if gen.finish_reason == "stop":
        assert isinstance(json.loads(gen.text), dict)
    else:  # cut by max_new_tokens: still the start of an object
        assert gen.text.startswith("{")


def test_check_format_refuses_what_cannot_compile() -> None:
    check_format(FORMAT)
    check_format({"type": "json_object"})
    with pytest.raises(FormatError):
        check_format({"type": "json_schema", "schema": {"type": "no-such-type"}})
    with pytest.raises(FormatError):
        check_format({"type": "json_schema", "schema": {"type": "array", "uniqueItems": True}})
    with pytest.raises(FormatError):
        check_format({"type": "xml"})


def test_apply_bitmask_keeps_exactly_the_allowed_tokens() -> None:
    logits = np.arange(70, dtype=np.float32)
    bits = np.zeros(3, dtype=np.int32)
    for token in (0, 5, 31, 32, 69):
        bits[token // 32] |= np.int32(1 << (token % 32)) if token % 32 != 31 else np.int32(-2**31)
    masked = apply_bitmask(logits, bits)
    assert np.flatnonzero(np.isfinite(masked)).tolist() == [0, 5, 31, 32, 69]
    assert masked[69] == 69.0 and logits[1] == 1.0  # a new array; the input is untouched


def test_constraint_refuses_a_token_the_grammar_forbids(session: DecoderSession) -> None:
    from uniun.models.constrain import ConstraintError

    c = Constraint(FORMAT, session.tokenizer, session.eos_ids)
    logits = np.zeros(session.config["vocab_size"], dtype=np.float32)
    allowed = np.flatnonzero(np.isfinite(c.mask(logits)))
    bad = next(t for t in range(len(logits)) if t not in set(allowed.tolist()))
    with pytest.raises(ConstraintError):
        c.consume(int(bad))
