"""Extraction with the real SmolLM2 under its JSON schema: the five sample notes give
answers that parse and validate, every run (greedy decoding is deterministic), and the
stored knowledge is unique by name.

Before constrained decoding the same prompts ended at ``max_new_tokens`` every time with
broken JSON (docs/structured-output.md has the before/after table)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.models_cache import shared_store
from uniun.actors.producers.extract import ExtractSettings, note_job
from uniun.actors.producers.extraction import (
    EXTRACTION_FORMAT,
    EXTRACTION_SCHEMA,
    extraction_messages,
    parse_extraction,
)
from uniun.actors.producers.notes import note_title
from uniun.actors.producers.samples import SAMPLE_NOTES

pytestmark = pytest.mark.smollm2


def test_extraction_jobs_ask_for_the_schema(tmp_path) -> None:
    job, _ = note_job("a.md", "sha", "Ada met Charles.", 0, ExtractSettings(notes_dir=tmp_path))
    assert job["format"] == EXTRACTION_FORMAT
    arrays = EXTRACTION_SCHEMA["properties"]
    assert arrays["entities"]["maxItems"] and arrays["relations"]["maxItems"]


def test_five_sample_notes_parse_and_validate(smollm2: str, tmp_path) -> None:
    from uniun.models.session import DecoderSession

    session = DecoderSession.load(shared_store().path(smollm2), threads=2)
    budget = ExtractSettings(notes_dir=tmp_path).max_new_tokens
    assert len(SAMPLE_NOTES) == 5
    for name, text in SAMPLE_NOTES.items():
        gen = session.start(messages=extraction_messages(text, title=note_title(name, text)),
                            max_new_tokens=budget, format=EXTRACTION_FORMAT)
        list(session.generate(gen))
        assert gen.finish_reason == "stop", (name, gen.text)
        answer = json.loads(gen.text)
        jsonschema.validate(answer, EXTRACTION_SCHEMA)
        result = parse_extraction(gen.text)
        assert result.error is None and result.repairs == (), (name, result)
        names = [e["name"].lower() for e in result.parsed["entities"]]
        assert names and len(names) == len(set(names)), (name, result.parsed)
        triples = [tuple(r.values()) for r in result.parsed["relations"]]
        assert len(triples) == len(set(triples))
