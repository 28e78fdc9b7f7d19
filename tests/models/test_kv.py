"""Parked KV states and the parking lot: sizes, spill files, and shedding in the right order."""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
import pytest

from tests.models_cache import shared_store
from uniun.models.convert.recipes import ensure_model
from uniun.models.kv import JobProgress, KVCache, ParkedState, SnapshotCorrupt
from uniun.models.parking import ParkingLot
from uniun.models.sampling import SamplingParams
from uniun.models.session import DecoderSession

LAYERS, HEADS, DIM = 2, 2, 32
BYTES_PER_POS = 2 * LAYERS * HEADS * DIM * 4


def _kv(length: int, fill: float = 0.0) -> KVCache:
    rng = np.random.default_rng(length)
    return KVCache([(rng.standard_normal((1, HEADS, length, DIM)).astype(np.float32) + fill,
                     rng.standard_normal((1, HEADS, length, DIM)).astype(np.float32))
                    for _ in range(LAYERS)])


def _parked(job_id: str, length: int, static_prefix: int) -> ParkedState:
    progress = JobProgress(prompt_ids=list(range(length)), max_new_tokens=8,
                           sampling=SamplingParams(0.7, 0.9, 5, 3), seed=3,
                           generated_ids=[1], text="é", static_prefix=static_prefix,
                           job_id=job_id, model_id="m")
    return ParkedState(progress, _kv(length))


def test_progress_record_survives_msgpack() -> None:
    progress = _parked("a", 10, 4).progress
    wire = msgpack.unpackb(msgpack.packb(progress.to_record()))
    assert JobProgress.from_record(wire) == progress
    with pytest.raises(ValueError):
        JobProgress.from_record({"prompt_ids": "nope"})


def test_evict_keeps_exactly_the_prefix_and_reports_the_bytes() -> None:
    state = _parked("a", 10, 4)
    original = state.kv.layers[1][0].copy()
    assert state.nbytes == 10 * BYTES_PER_POS
    assert state.evict_to_prefix() == 6 * BYTES_PER_POS
    assert state.kv_length == 4 and state.nbytes == 4 * BYTES_PER_POS
    np.testing.assert_array_equal(state.kv.layers[1][0], original[:, :, :4, :])


def test_spill_round_trip_and_corruption_detected(tmp_path: Path) -> None:
    state = _parked("a/b", 10, 4)
    keep = [(k.copy(), v.copy()) for k, v in state.kv.layers]
    path = state.spill(tmp_path / "a.kvsnap")
    assert state.nbytes == 0 and state.kv_length == 10 and state.spilled
    loaded = ParkedState.load(path)
    assert loaded.progress == state.progress
    for (k, v), (k2, v2) in zip(keep, loaded.kv.layers):
        np.testing.assert_array_equal(k, k2)
        np.testing.assert_array_equal(v, v2)
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(SnapshotCorrupt):
        ParkedState.load(path)
    (tmp_path / "junk").write_bytes(b"not a snapshot")
    with pytest.raises(SnapshotCorrupt):
        ParkedState.load(tmp_path / "junk")


def test_parking_lot_trims_then_spills_then_drops_oldest_first(tmp_path: Path) -> None:
    # Four jobs of 100 positions with a 20-position system prompt; room for 250 positions.
    lot = ParkingLot(250 * BYTES_PER_POS, spill_dir=tmp_path, max_disk_bytes=120 * BYTES_PER_POS)
    for name in "abc":
        lot.park(name, _parked(name, 100, 20))
    assert lot.stats().trimmed == 1  # 300 > 250: the oldest, a, was trimmed to its prefix
    assert lot.get("a").kv_length == 20 and lot.get("b").kv_length == 100
    lot.park("d", _parked("d", 100, 20))  # 320: b trimmed (220)
    assert [lot.get(j).kv_length for j in "abcd"] == [20, 20, 100, 100]
    lot.park("e", _parked("e", 100, 20))  # 320 -> c, d trimmed: 160
    assert [lot.get(j).kv_length for j in "abcde"] == [20, 20, 20, 20, 100]
    assert lot.nbytes <= lot.max_bytes
    lot.park("f", _parked("f", 100, 0))  # 260: e is the last one that can be trimmed
    assert lot.get("e").kv_length == 20 and lot.stats().spilled == 0
    lot.park("g", _parked("g", 100, 0))  # 300: nothing left to trim, spill a, b, c
    assert [lot.get(j).spilled for j in "abcd"] == [True, True, True, False]
    lot.park("h", _parked("h", 100, 0))  # 340: spill d, e; f does not fit the disk: drop it
    assert lot.get("d").spilled and lot.get("e").spilled
    assert lot.get("f").kv_length == 0 and lot.get("g").kv_length == 100
    stats = lot.stats()
    assert (stats.spilled, stats.dropped) == (5, 1) and lot.nbytes <= lot.max_bytes
    assert lot.disk_bytes <= lot.max_disk_bytes
    assert lot.get("h").nbytes == 100 * BYTES_PER_POS  # the newest kept its whole snapshot
    assert len(lot) == 8  # nothing lost: every job still has its progress
    for name in "abcdefgh":
        assert lot.get(name).progress.generated_ids == [1]
    state = lot.take("a")
    assert state.load_kv().length == 20  # the spilled prefix comes back from disk
    state.discard_spill()  # what DecoderSession.resume does once it has the KV
    assert lot.discard("b") and not lot.discard("zz")
    lot.clear()
    assert not list(tmp_path.glob("*.kvsnap"))  # spill files do not outlive their jobs


def test_parked_jobs_under_pressure_all_finish_with_the_right_tokens(tiny_model: str,
                                                                     tmp_path: Path) -> None:
    session = DecoderSession.load(ensure_model(tiny_model, shared_store()), threads=1)
    system = {"role": "system", "content": "You are a helpful assistant. Answer the question."}
    questions = [f"Question {i}: what is {i} plus {i}?" for i in range(6)]

    def uninterrupted(q: str) -> list[int]:
        gen = session.start(messages=[system, {"role": "user", "content": q}], max_new_tokens=24)
        return [e.token_id for e in session.generate(gen)]

    expected = {q: uninterrupted(q) for q in questions}
    one_job = 60 * session.kv_bytes_per_token
    lot = ParkingLot(one_job, spill_dir=tmp_path, max_disk_bytes=30 * session.kv_bytes_per_token)
    gens = {q: session.start(messages=[system, {"role": "user", "content": q}],
                             max_new_tokens=24, job_id=q) for q in questions}
    tokens: dict[str, list[int]] = {q: [] for q in questions}
    for _round in range(3):  # each job runs 8 tokens, then is parked while the others run
        for q in questions:
            gen = session.resume(lot.take(q)) if q in lot else gens[q]
            for _ in range(8):
                tokens[q].append(session.step(gen).token_id)
            if not gen.finished:
                lot.park(q, session.park(gen))
    stats = lot.stats()
    assert stats.trimmed and stats.spilled and stats.dropped  # every stage was exercised
    assert tokens == expected


def _passes(kv: int, prompt: int, total: int, static: int, *, for_step: bool, exact: bool = True,
            budget: int | None = None) -> list[tuple[int, int]]:
    from uniun.models.feed_plan import next_pass

    out = []
    while (plan := next_pass(kv_length=kv, prompt_len=prompt, total=total, static_prefix=static,
                             cache_split=True, exact=exact, for_step=for_step,
                             budget=budget)) is not None:
        out.append(plan)
        kv = plan[1]
    if for_step:
        out.append((kv, total))  # the step's own final pass
    return out


def _single_fed(passes: list[tuple[int, int]]) -> dict[int, bool]:
    """Position -> was it computed in a one-position pass (last computation wins)."""
    fed: dict[int, bool] = {}
    for start, end in passes:
        for pos in range(start, end):
            fed[pos] = end - start == 1
    return fed


@pytest.mark.parametrize("prompt", [1, 2, 3, 5, 40])
@pytest.mark.parametrize("chunk", [None, 2, 7])
def test_resume_replays_every_position_the_way_the_run_computed_it(prompt: int,
                                                                   chunk: int | None) -> None:
    # A job runs (a chunked prefill, then steps), is paused after each token, loses its KV
    # down to 0, its static prefix, or one position short of its prompt, and resumes.
    static = max(0, min(prompt // 2, prompt - 2))
    total = prompt + 6
    run: list[tuple[int, int]] = []
    kv = 0
    if chunk:
        run += _passes(0, prompt, prompt, static, for_step=False, budget=chunk)
        kv = run[-1][1] if run else 0
    run += _passes(kv, prompt, prompt, static, for_step=True)
    for t in range(prompt + 1, total + 1):
        run += _passes(t - 1, prompt, t, static, for_step=True)
    original = _single_fed(run)
    for paused_at in range(prompt + 1, total + 1):
        for kept in {0, static, max(0, prompt - 1), paused_at - 1}:
            replay = _passes(kept, prompt, paused_at, static, for_step=True)
            assert replay[0][0] <= kept and replay[-1][1] == paused_at
            for pos, single in _single_fed(replay).items():
                assert single == original[pos], (paused_at, kept, pos)
