"""KV written in place (GroupQueryAttention + IOBinding), parked KV in fp16, the tokenizer.

What a user would notice if these broke: a resumed job continuing with other tokens than
it would have, two jobs sharing a cached prompt corrupting each other, the parking cap
holding fewer jobs than it says, a chat rendered differently from transformers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.models_cache import shared_store
from uniun.models.convert.recipes import ensure_model
from uniun.models.kv import KVBuffer
from uniun.models.parking import ParkingLot
from uniun.models.session import DecoderSession

N = 24


@pytest.fixture(scope="module")
def session(tiny_model: str) -> DecoderSession:
    return DecoderSession.load(ensure_model(tiny_model, shared_store()), threads=1,
                               prefix_cache_bytes=0)


def _tokens(session: DecoderSession, gen) -> list[int]:  # type: ignore[no-untyped-def]
    return [e.token_id for e in session.generate(gen)]


def test_the_built_graph_updates_kv_in_place_and_matches_the_concatenating_path(
        session: DecoderSession, tiny_model: str) -> None:
    assert session.kv_in_place
    concat = DecoderSession.load(ensure_model(tiny_model, shared_store()), threads=1,
                                 prefix_cache_bytes=0)
    concat.kv_in_place = False  # the same graph, fed exact-length past arrays
    ids = [5, 9, 13, 17, 21, 25, 29]
    a, ka = session.forward(ids, None)
    b, kb = concat.forward(ids, None)
    for token in (3, 7, 11, 2):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        a, ka = session.forward([token], ka)
        b, kb = concat.forward([token], kb)
    assert ka.buffer is not None and kb.buffer is None
    assert ka.length == kb.length == len(ids) + 4
    for (k1, v1), (k2, v2) in zip(ka.layers, kb.layers):
        np.testing.assert_allclose(k1, k2, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(v1, v2, rtol=1e-5, atol=1e-5)


def test_decode_steps_reuse_one_buffer_and_copy_nothing(session: DecoderSession) -> None:
    gen = session.start(prompt_ids=[4, 8, 15, 16, 23, 42], max_new_tokens=N, ignore_eos=True)
    session.step(gen)
    made, copied = session.kv_buffers_made, session.kv_copied_bytes
    buffer = gen.kv.buffer
    for _ in range(N - 1):
        session.step(gen)
    assert gen.kv.buffer is buffer and buffer.written == gen.kv.length
    assert (session.kv_buffers_made, session.kv_copied_bytes) == (made, copied)


def test_a_finished_jobs_buffer_is_freed_before_the_next_job_allocates_its_own(
        session: DecoderSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two KV buffers alive at once were the runner's peak RSS between two jobs."""
    import gc
    import weakref

    import uniun.models.decoder_model as decoder_model

    first = session.start(prompt_ids=[4, 8, 15, 16], max_new_tokens=4, ignore_eos=True)
    list(session.generate(first))
    old = weakref.ref(first.kv.buffer)
    del first
    gc.collect()
    alive_at_allocation = []

    class Watched(KVBuffer):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            alive_at_allocation.append(old() is not None)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(decoder_model, "KVBuffer", Watched)
    second = session.start(prompt_ids=[23, 42], max_new_tokens=2, ignore_eos=True)
    list(session.generate(second))
    assert alive_at_allocation == [False]


def test_one_snapshot_resumed_twice_continues_the_same_way_both_times(
        session: DecoderSession) -> None:
    """The first resume appends in place; the second, from the same snapshot, must not
    see what the first wrote (it gets a copy), and both give the uninterrupted tokens."""
    prompt = [7, 1, 8, 2, 8, 1, 8]
    want = _tokens(session, session.start(prompt_ids=prompt, max_new_tokens=N,
                                          ignore_eos=True))
    gen = session.start(prompt_ids=prompt, max_new_tokens=N, ignore_eos=True)
    head = [session.step(gen).token_id for _ in range(N // 2)]
    parked = session.park(gen)
    snapshot = (parked.progress.to_record(), parked.kv)
    first = head + _tokens(session, session.resume(parked))
    from uniun.models.kv import JobProgress, ParkedState

    again = ParkedState(JobProgress.from_record(snapshot[0]), snapshot[1])
    second = head + _tokens(session, session.resume(again))
    assert first == want and second == want


def test_buffers_grow_past_their_capacity_without_changing_the_tokens(
        session: DecoderSession, monkeypatch: pytest.MonkeyPatch) -> None:
    import uniun.models.decoder_model as dm

    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    want = _tokens(session, session.start(prompt_ids=prompt, max_new_tokens=N,
                                          ignore_eos=True))
    monkeypatch.setattr(dm, "KV_CHUNK", 4)  # grow every few tokens
    gen = session.start(prompt_ids=prompt, max_new_tokens=N, ignore_eos=True)
    got = _tokens(session, gen)
    assert got == want
    assert gen.kv.buffer.capacity < len(prompt) + N + 8


def test_a_buffer_refuses_appends_from_a_stale_view() -> None:
    buf = KVBuffer(layers=2, kv_heads=1, head_dim=4, capacity=8)
    buf.written = 5
    assert buf.appendable(5, 3) and not buf.appendable(5, 4)  # capacity
    assert not buf.appendable(3, 1)  # someone wrote positions 3..4 after this view
    view = buf.view(5)
    assert view.length == 5 and view.nbytes == buf.nbytes  # it keeps the whole buffer


def test_fp16_parking_holds_half_the_bytes_and_the_job_resumes(
        session: DecoderSession, tmp_path: Path) -> None:
    prompt = [2, 7, 1, 8, 2, 8]
    want = _tokens(session, session.start(prompt_ids=prompt, max_new_tokens=N,
                                          ignore_eos=True))
    lots = {dtype: ParkingLot(1 << 30, spill_dir=tmp_path, kv_dtype=dtype)
            for dtype in ("float32", "float16")}
    sizes, outputs = {}, {}
    for dtype, lot in lots.items():
        gen = session.start(prompt_ids=prompt, max_new_tokens=N, ignore_eos=True,
                            job_id=dtype)
        head = [session.step(gen).token_id for _ in range(N // 2)]
        lot.park(dtype, session.park(gen))
        state = lot.get(dtype)
        sizes[dtype] = state.kv.compact().nbytes
        assert state.kv.dtype == np.dtype(dtype)
        outputs[dtype] = head + _tokens(session, session.resume(lot.take(dtype)))
    assert sizes["float16"] * 2 == sizes["float32"]
    assert outputs["float32"] == want
    assert len(outputs["float16"]) == N  # rounding may change a near tie; it still runs
    with pytest.raises(ValueError, match="float32 or float16"):
        ParkingLot(1, spill_dir=tmp_path, kv_dtype="int8")


def test_the_light_tokenizer_renders_and_encodes_like_transformers() -> None:
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from uniun.models.chat_template import encode_chat
    from uniun.models.tokenizer import LightTokenizer

    folder = ensure_model("tiny-1", shared_store())
    hf, light = AutoTokenizer.from_pretrained(str(folder)), LightTokenizer(folder)
    for text in ("Hello world", " spaced  out", "naïve café 😀", "line\n\nbreaks\t"):
        for special in (True, False):
            assert light(text, add_special_tokens=special)["input_ids"] == \
                hf(text, add_special_tokens=special)["input_ids"]
        ids = hf(text)["input_ids"]
        assert light.decode(ids, skip_special_tokens=True) == \
            hf.decode(ids, skip_special_tokens=True)
    assert light.eos_token_id == hf.eos_token_id
    if hf.chat_template:
        messages = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi?"}]
        assert encode_chat(light, messages) == encode_chat(hf, messages)


def test_over_the_cap_a_parked_buffer_is_compacted_before_anything_is_trimmed(
        session: DecoderSession, tmp_path: Path) -> None:
    gen = session.start(prompt_ids=[9, 8, 7, 6, 5, 4, 3, 2], max_new_tokens=N,
                        ignore_eos=True, static_prefix=4, job_id="c")
    for _ in range(3):
        session.step(gen)
    used = gen.kv.compact().nbytes
    assert gen.kv.nbytes > used  # the buffer has spare capacity
    lot = ParkingLot(used, spill_dir=tmp_path)
    lot.park("c", session.park(gen))
    state = lot.get("c")
    assert state.kv.buffer is None and state.nbytes == used
    assert state.kv_length == 10 and lot.stats().trimmed == 0
