"""Sampling, incremental detokenisation and stop strings: what the user sees as text."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models_cache import shared_store
from uniun.models.detokenize import IncrementalDetokenizer, StopMatcher
from uniun.models.sampling import SamplingParams, sample_token
from uniun.protocol.jobmap import Sampling


def _logits(seed: int = 0, vocab: int = 1000) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(vocab) * 2).astype(np.float32)


def test_greedy_is_argmax_and_ignores_the_seed() -> None:
    logits = _logits()
    picks = {sample_token(logits, SamplingParams(), seed, seq) for seed in range(5) for seq in range(5)}
    assert picks == {int(np.argmax(logits))}


def test_same_seed_same_tokens_other_seed_other_tokens() -> None:
    params = SamplingParams(temperature=1.0, seed=7)
    flat = np.zeros(1000, np.float32)
    a = [sample_token(flat, params, 7, seq) for seq in range(50)]
    b = [sample_token(flat, params, 7, seq) for seq in range(50)]
    c = [sample_token(flat, params, 8, seq) for seq in range(50)]
    assert a == b
    assert a != c
    assert len(set(a)) > 30  # a flat distribution really is sampled, not argmax'd


def test_temperature_sampling_follows_the_distribution() -> None:
    logits = np.log(np.array([0.7, 0.3], np.float32))
    picks = [sample_token(logits, SamplingParams(temperature=1.0), 123, seq) for seq in range(4000)]
    assert abs(picks.count(0) / len(picks) - 0.7) < 0.03


def test_top_k_and_top_p_restrict_the_candidates() -> None:
    logits = _logits(1)
    order = np.argsort(-logits)
    top5 = set(order[:5].tolist())
    picks = {sample_token(logits, SamplingParams(temperature=5.0, top_k=5), 1, s) for s in range(300)}
    assert picks <= top5 and len(picks) > 1
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    nucleus = int(np.searchsorted(np.cumsum(probs[order]), 0.5)) + 1
    picks = {sample_token(logits, SamplingParams(temperature=1.0, top_p=0.5), 2, s) for s in range(300)}
    assert picks <= set(order[:nucleus].tolist())
    tiny_p = {sample_token(logits, SamplingParams(temperature=1.0, top_p=1e-6), 3, s) for s in range(20)}
    assert tiny_p == {int(order[0])}


@pytest.mark.parametrize("temperature", [5e-324, 1e-308, 1e-300])
def test_a_vanishing_temperature_is_greedy_and_keeps_a_mask(temperature: float) -> None:
    """logits / T overflows: without care every probability is NaN and token 0 comes
    out, even where a grammar mask (-inf) forbids it."""
    logits = _logits(4)
    logits[: len(logits) // 2] = -np.inf  # token 0 among the forbidden
    allowed_best = int(np.argmax(logits))
    for top_k, top_p in ((0, 1.0), (5, 1.0), (0, 0.5)):
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
        assert {sample_token(logits, params, 1, s) for s in range(10)} == {allowed_best}


def test_bad_parameters_are_refused_and_the_wire_type_is_accepted() -> None:
    for bad in ({"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": -2}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    assert SamplingParams.coerce(Sampling(0.5, 0.9, 40, 3)) == SamplingParams(0.5, 0.9, 40, 3)
    assert SamplingParams.coerce(None).greedy


@pytest.fixture(scope="module")
def tokenizer(tiny_model: str):
    from transformers import AutoTokenizer

    from uniun.models.convert.recipes import ensure_model

    return AutoTokenizer.from_pretrained(str(ensure_model(tiny_model, shared_store())))


def test_incremental_detok_never_emits_half_a_character(tokenizer) -> None:
    # The tiny tokenizer was trained on ASCII: every accented letter, CJK character and
    # emoji below is split into single-byte tokens, the hard case for streaming.
    text = "Grüße aus Köln — 東京は晴れ 🙂👍🏽 done."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > len(text)  # really split below character boundaries
    detok = IncrementalDetokenizer(tokenizer, context_ids=tokenizer("Hi:")["input_ids"])
    deltas = [detok.push(t) for t in ids]
    deltas.append(detok.flush())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text
    assert any(d == "" for d in deltas)  # it did hold back unfinished characters


def test_detok_replay_rebuilds_the_same_state(tokenizer) -> None:
    ids = tokenizer("héllo wörld, 日本", add_special_tokens=False)["input_ids"]
    whole = IncrementalDetokenizer(tokenizer)
    first = [whole.push(t) for t in ids]
    half = IncrementalDetokenizer(tokenizer)
    half.replay(ids[:7])
    second = [half.push(t) for t in ids[7:]]
    assert "".join(first[7:]) == "".join(second)


def test_stop_matcher_holds_back_only_possible_stop_prefixes() -> None:
    stop = StopMatcher(["</end>", "\n\n"])
    assert stop.safe_length("hello </e") == len("hello ")
    assert stop.safe_length("hello\n") == len("hello")
    assert stop.safe_length("hello <") == len("hello ")
    assert stop.safe_length("a < b") == len("a < b")
    assert stop.find("abc</end>x") == 3
    assert stop.find("no stop here") == -1
