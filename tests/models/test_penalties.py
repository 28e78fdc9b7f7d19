"""Penalties on repeated tokens, log-probabilities, and the chat defaults: what changes the
text a user reads, and what survives a pause.

The penalty checks compare with a line-by-line transcription of llama.cpp's penalties
sampler (``llama_sampler_penalties_accept`` / ``_apply`` in its ``llama-sampler.cpp``: a
ring buffer of the last ``penalty_last_n`` accepted ids, a count per id, float32
arithmetic), fed the prompt first as llama.cpp's server and CLI do.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.models_cache import shared_store
from uniun.models import sampling_ops
from uniun.models.chat_defaults import chat_defaults
from uniun.models.convert.recipes import ensure_model
from uniun.models.kv import ParkedState
from uniun.models.logprobs import token_logprobs
from uniun.models.penalties import Penalties
from uniun.models.sampling import SamplingParams
from uniun.models.session import DecoderSession


class LlamaCppPenalties:
    """llama.cpp's penalties sampler, transcribed (prompt and generated ids all accepted)."""

    def __init__(self, last_n: int, repeat: float, freq: float, present: float) -> None:
        self.last_n, self.prev, self.count = last_n, [], {}
        self.repeat, self.freq, self.present = (np.float32(repeat), np.float32(freq),
                                                np.float32(present))

    def accept(self, token: int) -> None:
        if self.last_n == 0:
            return
        self.count[token] = self.count.get(token, 0) + 1
        if len(self.prev) >= self.last_n:
            old = self.prev.pop(0)
            self.count[old] -= 1
            if self.count[old] == 0:
                del self.count[old]
        self.prev.append(token)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        out = logits.astype(np.float32).copy()
        for token, count in self.count.items():
            logit = out[token]
            logit = logit * self.repeat if logit <= 0 else logit / self.repeat
            out[token] = logit - (np.float32(count) * self.freq
                                  + np.float32(count > 0) * self.present)
        return out


def _logits(rng: np.random.Generator, vocab: int = 300) -> np.ndarray:
    return (rng.standard_normal(vocab) * 3).astype(np.float32)


@pytest.mark.parametrize("last_n", [1, 8, 64])
def test_repetition_penalty_is_llama_cpps_bit_for_bit(last_n: int) -> None:
    rng = np.random.default_rng(last_n)
    prompt = rng.integers(0, 40, 50).tolist()  # a small id range: many repeats
    params = SamplingParams(repetition_penalty=1.1, repeat_last_n=last_n)
    ours = Penalties(params, prompt)
    theirs = LlamaCppPenalties(last_n, 1.1, 0.0, 0.0)
    for token in prompt:
        theirs.accept(token)
    for _ in range(80):
        logits = _logits(rng)
        got, want = ours.apply(logits.copy()), theirs.apply(logits)
        assert got.dtype == np.float32 and got.tobytes() == want.tobytes()
        token = int(np.argmax(got)) if rng.random() < 0.5 else int(rng.integers(0, 40))
        ours.accept(token)
        theirs.accept(token)


def test_frequency_and_presence_count_generated_tokens_only() -> None:
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    pen = Penalties(params, prompt_ids=[7, 7, 7], generated_ids=[3, 3, 5])
    logits = np.zeros(10, np.float32)
    out = pen.apply(logits.copy())
    assert out[7] == 0.0  # the prompt does not count (OpenAI's semantics)
    assert out[3] == np.float32(-(2 * 0.5 + 0.25)) and out[5] == np.float32(-(0.5 + 0.25))
    pen.accept(5)
    assert pen.apply(logits.copy())[5] == np.float32(-(2 * 0.5 + 0.25))
    frozen = np.zeros(10, np.float32)
    frozen.flags.writeable = False  # an array it may not write is copied, not refused
    assert pen.apply(frozen)[5] != 0.0 and frozen.tolist() == [0.0] * 10
    assert np.shares_memory(pen.apply(logits), logits)  # the step's own: in place


def test_window_bounds_whole_history_and_off() -> None:
    logits = np.full(10, 2.0, np.float32)
    history = [1, 2, 3, 4]
    window = Penalties(SamplingParams(repetition_penalty=2.0, repeat_last_n=2), history)
    assert window.apply(logits.copy()).tolist() == [2, 2, 2, 1, 1, 2, 2, 2, 2, 2]
    whole = Penalties(SamplingParams(repetition_penalty=2.0, repeat_last_n=-1), history)
    assert whole.apply(logits.copy()).tolist() == [2, 1, 1, 1, 1, 2, 2, 2, 2, 2]
    off = SamplingParams(repetition_penalty=2.0, repeat_last_n=0)
    assert not off.penalized and not Penalties(off, history).active
    # negative logits are pushed down too: multiplied, not divided
    neg = Penalties(SamplingParams(repetition_penalty=2.0), [0]).apply(
        np.array([-1.0, 1.0], np.float32))
    assert neg.tolist() == [-2.0, 1.0]


def test_state_rebuilt_from_the_ids_equals_the_state_built_token_by_token() -> None:
    rng = np.random.default_rng(3)
    params = SamplingParams(repetition_penalty=1.3, repeat_last_n=16, frequency_penalty=0.4,
                            presence_penalty=-0.2)
    prompt, generated = rng.integers(0, 30, 20).tolist(), rng.integers(0, 30, 45).tolist()
    step_by_step = Penalties(params, prompt)
    for token in generated:
        step_by_step.accept(token)
    rebuilt = Penalties(params, prompt, generated)
    logits = _logits(rng, 30)
    assert step_by_step.apply(logits.copy()).tobytes() == rebuilt.apply(logits.copy()).tobytes()


def test_bad_sampling_values_are_refused() -> None:
    for bad in ({"repetition_penalty": 0.0}, {"repeat_last_n": -2}, {"min_p": 1.5},
                {"frequency_penalty": 2.5}, {"presence_penalty": -3.0}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_min_p_keeps_only_tokens_near_the_top() -> None:
    from uniun.models.sampling import sample_token

    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    params = SamplingParams(temperature=1.0, min_p=0.5)  # keeps p >= 0.25
    assert {sample_token(logits, params, 9, s) for s in range(300)} == {0, 1}


def test_logprobs_are_a_log_softmax_and_the_first_alternative_is_the_greedy_pick() -> None:
    rng = np.random.default_rng(5)
    for _ in range(50):
        logits = _logits(rng, 500)
        logits[rng.integers(0, 500, 3)] = logits.max()  # ties at the top: lowest id wins
        greedy = int(np.argmax(logits))
        lp = token_logprobs(logits, greedy, 5)
        ref = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
        assert lp.top[0][0] == greedy and abs(lp.logprob - ref[greedy]) < 1e-5
        assert [t for t, _ in lp.top] == sorted(range(500), key=lambda i: (-logits[i], i))[:5]
    masked = np.full(10, -np.inf, np.float32)
    masked[[2, 6]] = [1.0, 0.5]
    lp = token_logprobs(masked, 2, 5)  # forbidden tokens are no alternatives
    assert [t for t, _ in lp.top] == [2, 6] and all(np.isfinite(v) for _, v in lp.top)


@pytest.mark.parametrize("vocab", [300, 3000, 49152, 50001])
def test_the_top_alternatives_are_a_full_sorts_first_k_whatever_the_ties(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    for trial in range(20):
        row = np.round(rng.standard_normal(vocab) * 2, 1).astype(np.float32)  # many ties
        if trial % 3 == 0:
            row[rng.random(vocab) < 0.9] = -np.inf  # a grammar's mask
        k = int(rng.integers(1, 21))
        want = sorted(range(vocab), key=lambda i: (-row[i], i))[:k]
        got = token_logprobs(row, want[0], k).top
        assert [t for t, _ in got] == [i for i in want if np.isfinite(row[i])]


@pytest.mark.skipif(not sampling_ops.available(), reason="the kernel library is not built")
def test_the_c_helpers_give_the_numpy_fallbacks_numbers_bit_for_bit() -> None:
    rng = np.random.default_rng(11)
    for vocab in (10, 300, 49152):
        for _ in range(20):
            x = np.round(rng.standard_normal(vocab) * 3, 1).astype(np.float32)
            x[rng.random(vocab) < 0.2] = -np.inf
            # distinct ids, as the penalties' counters give them; ids outside are skipped
            window = rng.choice(np.arange(-2, vocab + 2), min(40, vocab), replace=False)
            generated = rng.choice(vocab, min(30, vocab), replace=False)
            counts = rng.integers(1, 5, generated.shape[0]).astype(np.float32)
            a, b = x.copy(), x.copy()
            sampling_ops.penalize(a, window, 1.3, generated, counts, 0.7, -0.3)
            sampling_ops.penalize(b, window, 1.3, generated, counts, 0.7, -0.3, use_c=False)
            assert a.tobytes() == b.tobytes()
            k = int(rng.integers(1, 21))
            assert sampling_ops.top_k(a, k).tolist() == sampling_ops.top_k(
                a, k, use_c=False).tolist()


def test_chat_defaults_come_from_the_table_and_the_models_generation_config(
        tmp_path: Path) -> None:
    tiny = chat_defaults("tiny-1")
    assert tiny == {"repetition_penalty": 1.1, "repeat_last_n": 64}  # greedy + penalty
    assert chat_defaults("smollm2-135m-instruct")["temperature"] > 0
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_k": 20, "eos_token_id": 2}))
    assert chat_defaults("other", tmp_path) == {"repetition_penalty": 1.1,
                                                "repeat_last_n": 64, "temperature": 0.6,
                                                "top_k": 20}
    # advice outside the declared ranges (protocol/sampling_fields.py) would make every
    # chat of the model refused: it is left out, the rest kept
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 12.0, "top_p": 0, "top_k": 20}))
    assert chat_defaults("other", tmp_path) == {"repetition_penalty": 1.1,
                                                "repeat_last_n": 64, "top_k": 20}
    # the job's own values win; a job that does not ask for them gets neutral settings
    given = SamplingParams.coerce({"defaults": "model", "temperature": 0.0}, tiny | {
        "temperature": 0.7})
    assert given.temperature == 0.0 and given.repetition_penalty == 1.1
    assert SamplingParams.coerce({"temperature": 0.0}, tiny).repetition_penalty == 1.0


# -- in the session (tiny model): a pause changes nothing ---------------------------------

MESSAGES = [{"role": "user", "content": "Say something that repeats itself a lot."}]
SAMPLING = {"temperature": 0.8, "top_k": 40, "min_p": 0.02, "seed": 1234,
            "repetition_penalty": 1.3, "repeat_last_n": 16, "frequency_penalty": 0.3,
            "presence_penalty": 0.2}
N = 48


@pytest.fixture(scope="module")
def session(tiny_model: str) -> DecoderSession:
    return DecoderSession.load(ensure_model(tiny_model, shared_store()), threads=1)


def _spill(parked: ParkedState, tmp: Path) -> ParkedState:
    return ParkedState.load(parked.spill(tmp / "job.kvsnap"))


def _recompute(parked: ParkedState, tmp: Path) -> ParkedState:
    return ParkedState.from_record(json.loads(json.dumps(parked.progress.to_record())))


def _evict(parked: ParkedState, tmp: Path) -> ParkedState:
    parked.evict_to_prefix()
    return parked


@pytest.mark.parametrize("shed", [None, _evict, _spill, _recompute],
                         ids=["snapshot", "partial-evict", "disk-spill", "recompute"])
def test_penalized_seeded_text_is_the_same_after_any_pause(
        session: DecoderSession, tmp_path: Path,
        shed: Callable[[ParkedState, Path], ParkedState] | None) -> None:
    def start() -> object:
        return session.start(messages=MESSAGES, max_new_tokens=N, sampling=SAMPLING,
                             use_prefix_cache=False, ignore_eos=True, logprobs=3)

    whole = list(session.generate(start()))
    plain = session.start(messages=MESSAGES, max_new_tokens=N, use_prefix_cache=False,
                          ignore_eos=True, sampling={**SAMPLING, "repetition_penalty": 1.0,
                                                     "frequency_penalty": 0.0,
                                                     "presence_penalty": 0.0})
    assert [e.token_id for e in session.generate(plain)] != [e.token_id for e in whole]
    for pause_at in (1, 17, 33):
        gen = start()
        events = [session.step(gen) for _ in range(pause_at)]
        parked = session.park(gen)
        if shed is not None:
            parked = shed(parked, tmp_path)
        events += list(session.generate(session.resume(parked)))
        assert [e.token_id for e in events] == [e.token_id for e in whole], pause_at
        if shed in (_evict, _recompute):  # the prompt is fed again cut at the static
            # prefix, another pass shape than the first prefill: that moves the last bits
            # of the tiny model's logits (not its tokens, which are checked above)
            assert all(abs(a.logprobs.logprob - b.logprobs.logprob) < 1e-4  # type: ignore
                       for a, b in zip(events, whole))
        else:
            assert [e.logprobs for e in events] == [e.logprobs for e in whole]


def test_greedy_logprobs_name_the_token_that_was_picked(session: DecoderSession) -> None:
    for sampling in (None, {"repetition_penalty": 1.5, "frequency_penalty": 1.0}):
        gen = session.start(messages=MESSAGES, max_new_tokens=N, sampling=sampling,
                            logprobs=4, ignore_eos=True)
        events = list(session.generate(gen))
        assert all(e.logprobs is not None and e.logprobs.top[0][0] == e.token_id
                   and e.logprobs.top[0][1] == e.logprobs.logprob for e in events)
        assert all(len(e.logprobs.top) == 4 for e in events)  # type: ignore[union-attr]
