"""Batched decoding (models/batch.py): a sequence's tokens do not depend on its batch.

What a user would notice if these broke: a chat that answers differently when a
background job happens to share its forward passes, a resumed job that drifts, ``n``
samples that are not the samples ``n`` single requests with those seeds give.

Every run below is checked against the same request run alone (``session.advance``):
the same token ids, the same text, and the same logits bit for bit at every step (the
SHA-1 of the float32 bytes the sampler saw). Schedules are drawn from fixed seeds: random
prompts, join steps, batch sizes 1-4, leaves (the sequence steps alone for a while, then
joins again), parks and resumes, greedy and seeded sampling.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.models_cache import shared_store
from uniun.models import qmatmul
from uniun.models.batch import DEFAULT_PREFILL_CHUNK, DecodeBatch
from uniun.models.convert.recipes import ensure_model
from uniun.models.generate import Generation
from uniun.models.session import DecoderSession

SHARED_PREFIX = 20  # tokens of the prompt prefix some requests share


def _tap(gen: Generation, log: list[str]) -> Generation:
    """Record the SHA-1 of each logits row the generation samples from."""
    choose = gen.choose

    def recorded(logits: np.ndarray) -> Any:
        log.append(hashlib.sha1(np.asarray(logits, np.float32).tobytes()).hexdigest())
        return choose(logits)

    gen.choose = recorded  # type: ignore[method-assign]
    return gen


def _specs(session: DecoderSession, rng: random.Random, runs: int, max_new: int,
           max_prompt: int) -> list[dict[str, Any]]:
    vocab = min(int(session.config["vocab_size"]), 40000)
    shared = [rng.randrange(3, vocab) for _ in range(SHARED_PREFIX)]
    specs = []
    for _ in range(runs):
        sampling = None if rng.random() < 0.5 else {
            "temperature": 0.9, "top_p": 0.95, "seed": rng.randrange(10_000)}
        ids = [rng.randrange(3, vocab) for _ in range(rng.randint(2, max_prompt))]
        spec = {"prompt_ids": ids, "max_new_tokens": rng.randint(1, max_new),
                "sampling": sampling}
        if rng.random() < 0.3:  # a system prompt that the prefix cache shares
            spec.update(prompt_ids=shared + ids, static_prefix=SHARED_PREFIX)
        specs.append(spec)
    return specs


def _alone(session: DecoderSession, spec: dict[str, Any],
           chunk: int = DEFAULT_PREFILL_CHUNK) -> tuple[list[int], str, list[str]]:
    """The request run alone, as the runner runs it (``advance`` with the batch's chunk:
    in the float form a prompt's logits depend on how it is cut into passes)."""
    log: list[str] = []
    gen = _tap(session.start(**spec, ignore_eos=True), log)
    ids = []
    while not gen.finished:
        event = session.advance(gen, chunk)
        if event is not None:
            ids.append(event.token_id)
    return ids, gen.text, log


def _batched(session: DecoderSession, specs: list[dict[str, Any]], rng: random.Random,
             size: int, chunk: int, seen: dict[str, int]
             ) -> list[tuple[list[int], str, list[str]]]:
    """Run every spec through one batch of ``size`` rows on a random schedule; ``seen``
    counts what the schedule did (leaves, parks, passes of several rows)."""
    batch = DecodeBatch(session, size=size, prefill_chunk=chunk)
    logs: list[list[str]] = [[] for _ in specs]
    ids: list[list[int]] = [[] for _ in specs]
    texts = [""] * len(specs)
    waiting = list(range(len(specs)))  # not started
    aside: list[tuple[int, Any, int]] = []  # (spec, Generation or ParkedState, steps left)
    index: dict[int, int] = {}  # id(gen) -> spec
    steps = 0

    def record(i: int, gen: Generation, event: Any) -> None:
        ids[i].append(event.token_id)
        texts[i] = gen.text

    while waiting or aside or len(batch):
        steps += 1
        assert steps < 20_000, "the schedule does not finish"
        if waiting and batch.free and rng.random() < 0.5:
            i = waiting.pop(0)
            gen = _tap(session.start(**specs[i], ignore_eos=True), logs[i])
            index[id(gen)] = i
            batch.join(gen)
        for entry in list(aside):  # come back after a while: rejoin, or resume and rejoin
            i, held, left = entry
            if left > 0 or not batch.free:
                continue
            aside.remove(entry)
            gen = held if isinstance(held, Generation) else _tap(session.resume(held), logs[i])
            index[id(gen)] = i
            batch.join(gen)
        aside = [(i, h, left - 1) for i, h, left in aside]
        for gen in list(batch.members):  # now and then one leaves or is parked
            if gen.finished or not gen.generated_ids or rng.random() > 0.1:
                continue
            i = index[id(gen)]
            if rng.random() < 0.5:
                alone = batch.leave(gen)
                seen["left"] += 1
                for _ in range(rng.randint(0, 2)):  # a few steps alone before rejoining
                    if not alone.finished:
                        record(i, alone, session.step(alone))
                if not alone.finished:
                    aside.append((i, alone, rng.randint(0, 3)))
            else:
                aside.append((i, batch.park(gen), rng.randint(0, 3)))
                seen["parked"] += 1
        for gen, event in batch.step().items():
            if event is not None:
                record(index[id(gen)], gen, event)
    seen["batched"] += batch.batched_passes
    return [(ids[i], texts[i], logs[i]) for i in range(len(specs))]


def _check_invariance(session: DecoderSession, seed: int, runs: int, *, max_new: int = 10,
                      max_prompt: int = 40) -> None:
    rng = random.Random(seed)
    differ = []
    seen = {"left": 0, "parked": 0, "batched": 0}
    for size in (1, 2, 3, 4):
        specs = _specs(session, rng, runs // 4, max_new, max_prompt)
        chunk = rng.choice((8, 16, 64))
        want = [_alone(session, spec, chunk) for spec in specs]
        got = _batched(session, specs, rng, size, chunk, seen)
        differ += [(size, i, w[0], g[0]) for i, (w, g) in enumerate(zip(want, got)) if w != g]
    assert not differ, f"{len(differ)} sequences differ from their single run: {differ[:3]}"
    assert min(seen.values()) > 0, seen  # the schedules did leave, park and batch


def _check_n_samples(session: DecoderSession, n: int = 4) -> None:
    """``n`` samples of one prompt equal ``n`` single runs with the same seeds, and the
    prompt is fed once."""
    prompt = [7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47]
    specs = [{"prompt_ids": prompt, "max_new_tokens": 12,
              "sampling": {"temperature": 1.0, "seed": 500 + i}} for i in range(n)]
    want = [_alone(session, spec) for spec in specs]
    batch = DecodeBatch(session, size=n)
    logs: list[list[str]] = [[] for _ in specs]
    gens = [_tap(session.start(**spec, ignore_eos=True), log) for spec, log in zip(specs, logs)]
    batch.join_group(gens)
    passes = session.passes
    while len(batch):
        batch.step()
    # one prompt pass, then one batched pass per token after the first
    assert session.passes - passes == 1 + 11
    got = [(g.generated_ids, g.text, log) for g, log in zip(gens, logs)]
    assert got == want
    assert len({tuple(g.generated_ids) for g in gens}) > 1  # the seeds do matter


def test_followers_lead_themselves_when_their_leader_is_parked_early(
        tiny: DecoderSession) -> None:
    """The leader of ``n`` samples parked before its prompt is fed: the others feed the
    prompt themselves, and every sample still equals its single run."""
    prompt = list(range(5, 45))
    specs = [{"prompt_ids": prompt, "max_new_tokens": 6,
              "sampling": {"temperature": 1.0, "seed": 70 + i}} for i in range(3)]
    want = [_alone(tiny, spec, 8)[0] for spec in specs]
    batch = DecodeBatch(tiny, size=3, prefill_chunk=8)
    gens = [tiny.start(**spec, ignore_eos=True) for spec in specs]
    batch.join_group(gens)
    batch.step()  # one chunk of the leader's prompt
    assert gens[0].kv_length == 8 and not gens[1].kv_length
    parked = batch.park(gens[0])
    while len(batch):
        batch.step()
    lead = tiny.resume(parked)
    while not lead.finished:
        tiny.step(lead)
    assert [lead.generated_ids, gens[1].generated_ids, gens[2].generated_ids] == want


def test_the_kv_pool_grows_under_running_sequences(tiny: DecoderSession) -> None:
    """A long prompt joins while another sequence decodes: the pool grows past its first
    256 positions (every row copied once) and both still equal their single runs."""
    specs = [{"prompt_ids": [9, 8, 7, 6], "max_new_tokens": 40, "sampling": None},
             {"prompt_ids": [(5 * i) % 500 + 3 for i in range(300)], "max_new_tokens": 20,
              "sampling": {"temperature": 0.9, "seed": 3}}]
    want = [_alone(tiny, spec, 64)[0] for spec in specs]
    batch = DecodeBatch(tiny, size=2, prefill_chunk=64)
    first, second = (tiny.start(**spec, ignore_eos=True) for spec in specs)
    batch.join(first)
    for _ in range(5):
        batch.step()
    capacity = batch.pool.capacity
    batch.join(second)
    while len(batch):
        batch.step()
    assert batch.pool.capacity > capacity
    assert [first.generated_ids, second.generated_ids] == want


# -- the graph forms ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tiny_model: str) -> DecoderSession:
    """Float weights, onnxruntime's GroupQueryAttention and MatMul."""
    return DecoderSession.load(ensure_model(tiny_model, shared_store()), threads=1,
                               prefix_cache_bytes=0)


def _gguf_session(tmp: Path, arith: str, qtype: str) -> DecoderSession:
    from tests.models.gguf_fixtures import write_tiny_gguf
    from uniun.models.convert.gguf_import import read_gguf
    from uniun.models.convert.hf_folder import write_hf_files
    from uniun.models.convert.onnx_decoder import build_decoder, save_decoder

    model = read_gguf(write_tiny_gguf(tmp / "tiny.gguf", "llama", qtype))
    save_decoder(build_decoder(model.config, model.weights, arith=arith), tmp, external=True)
    write_hf_files(tmp, model.config, model.tokenizer_json, model.tokenizer_config)
    return DecoderSession.load(tmp, threads=2)  # with the prefix cache


@pytest.fixture(scope="module")
def tiny_qmatmul(tmp_path_factory: pytest.TempPathFactory) -> DecoderSession:
    """Q4_1 blocks on QMatMul, with onnxruntime's GroupQueryAttention and norms."""
    if not qmatmul.fast():
        pytest.skip("QMatMul has no vector path on this CPU")
    session = _gguf_session(tmp_path_factory.mktemp("tiny-qmatmul"), "onnx", "Q4_1")
    assert "QMatMul" in session._graph_ops and "GroupQueryAttention" in session._graph_ops
    return session


@pytest.fixture(scope="module")
def tiny_ggml(tmp_path_factory: pytest.TempPathFactory) -> DecoderSession:
    """llama.cpp's arithmetic (Q8_0 blocks: QMatMul in ggml's order, GgmlAttention)."""
    try:
        session = _gguf_session(tmp_path_factory.mktemp("tiny-ggml"), "ggml", "Q8_0")
    except ValueError as exc:  # the form does not apply on this CPU (the reason is named)
        pytest.skip(str(exc))
    assert "GgmlAttention" in session._graph_ops
    return session


def test_tiny_float_gqa_is_batch_invariant(tiny: DecoderSession) -> None:
    _check_invariance(tiny, seed=1, runs=64)


def test_tiny_qmatmul_gqa_is_batch_invariant(tiny_qmatmul: DecoderSession) -> None:
    _check_invariance(tiny_qmatmul, seed=2, runs=48)


def test_tiny_ggml_arithmetic_is_batch_invariant(tiny_ggml: DecoderSession) -> None:
    _check_invariance(tiny_ggml, seed=3, runs=48)


def test_n_samples_equal_single_runs_with_their_seeds(tiny: DecoderSession) -> None:
    _check_n_samples(tiny)


def test_n_samples_in_llama_cpps_arithmetic(tiny_ggml: DecoderSession) -> None:
    _check_n_samples(tiny_ggml)


@pytest.mark.smollm2
def test_smollm2_is_batch_invariant_and_n_samples_match(smollm2: str) -> None:
    session = DecoderSession.load(ensure_model(smollm2, shared_store()), threads=2,
                                  prefix_cache_bytes=0)
    _check_invariance(session, seed=4, runs=40, max_new=8, max_prompt=24)
    _check_n_samples(session)


def test_bad_use_is_refused_and_changes_nothing(tiny: DecoderSession) -> None:
    batch = DecodeBatch(tiny, size=2)
    a = tiny.start(prompt_ids=[5, 6, 7], max_new_tokens=4)
    b = tiny.start(prompt_ids=[5, 6, 8], max_new_tokens=4)
    c = tiny.start(prompt_ids=[5, 6, 9], max_new_tokens=4)
    batch.join(a)
    with pytest.raises(ValueError, match="in the batch already"):
        batch.join(a)
    with pytest.raises(ValueError, match="free rows"):
        batch.join_group([b, c])
    with pytest.raises(ValueError, match="one prompt"):
        DecodeBatch(tiny, size=2).join_group([b, c])
    with pytest.raises(ValueError, match="not in this batch"):
        batch.leave(b)
    assert batch.members == [a]
    while len(batch):
        batch.step()
    assert a.finished and a.kv is None
