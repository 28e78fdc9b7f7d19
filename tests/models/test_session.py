"""The decoder session on the tiny model: steps, pause/resume in every way, stops, cache.

The tiny model's weights are random, so its text is gibberish — but deterministic, which
is all these tests need: a paused-and-resumed job must produce exactly the tokens of an
uninterrupted one, whatever they are.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.models_cache import shared_store
from uniun.models.convert.recipes import ensure_model
from uniun.models.decoder_model import Interrupted
from uniun.models.generate import FinishedError, TokenEvent
from uniun.models.kv import ParkedState, SnapshotCorrupt
from uniun.models.session import DecoderSession

MESSAGES = [{"role": "system", "content": "You are a helpful assistant. Answer the question."},
            {"role": "user", "content": "What is the capital of France?"}]
N = 40


@pytest.fixture(scope="module")
def session(tiny_model: str) -> DecoderSession:
    return DecoderSession.load(ensure_model(tiny_model, shared_store()), threads=1)


@pytest.fixture(scope="module")
def reference(session: DecoderSession) -> list[TokenEvent]:
    gen = session.start(messages=MESSAGES, max_new_tokens=N, use_prefix_cache=False)
    events = list(session.generate(gen))
    assert len({e.token_id for e in events}) > 8, "the tiny model should not be degenerate"
    return events


def _ids(events: list[TokenEvent]) -> list[int]:
    return [e.token_id for e in events]


def _evict(session: DecoderSession, parked: ParkedState, tmp: Path) -> ParkedState:
    assert parked.evict_to_prefix() > 0
    assert parked.kv_length == parked.progress.static_prefix > 0
    return parked


def _spill(session: DecoderSession, parked: ParkedState, tmp: Path) -> ParkedState:
    path = parked.spill(tmp / f"{parked.progress.job_id}.kvsnap")
    assert parked.nbytes == 0 and path.is_file()
    return ParkedState.load(path)  # as a freshly started runner would


def _drop(session: DecoderSession, parked: ParkedState, tmp: Path) -> ParkedState:
    # Nothing but the record survives (e.g. it went over msgpack to a new runner),
    # and no cached prefix helps: the whole prompt + generated ids are fed again.
    session.prefix_cache.clear()
    return ParkedState.from_record(parked.progress.to_record())


@pytest.mark.parametrize("shed", [None, _evict, _spill, _drop],
                         ids=["snapshot", "partial-evict", "disk-spill", "recompute"])
def test_pause_and_resume_yield_exactly_the_uninterrupted_tokens(
        session: DecoderSession, reference: list[TokenEvent], tmp_path: Path,
        shed: Callable[[DecoderSession, ParkedState, Path], ParkedState] | None) -> None:
    for pause_at in (1, 9, 26):
        gen = session.start(messages=MESSAGES, max_new_tokens=N, use_prefix_cache=False,
                            job_id=f"j{pause_at}")
        events = [session.step(gen) for _ in range(pause_at)]
        parked = session.park(gen)
        with pytest.raises(FinishedError):
            session.step(gen)  # a parked generation cannot be stepped behind our back
        if shed is not None:
            parked = shed(session, parked, tmp_path)
        resumed = session.resume(parked)
        if shed is _drop:
            assert resumed.kv_length == 0 and resumed.recomputed_tokens == len(
                resumed.progress.prompt_ids) + pause_at - 1
        assert resumed.generated_ids == _ids(events)
        events += list(session.generate(resumed))
        assert _ids(events) == _ids(reference), f"diverged after a pause at {pause_at}"
        assert [e.seq for e in events] == list(range(N))  # gap-free, nothing re-emitted
        assert "".join(e.text_delta for e in events) == resumed.text == \
            "".join(e.text_delta for e in reference)
        assert events[-1].finish_reason == "length"


def test_same_seed_same_text_across_a_pause(session: DecoderSession) -> None:
    sampling = {"temperature": 0.9, "top_p": 0.95, "seed": 11}

    def run(seed: int, pause_at: int | None) -> str:
        gen = session.start("Once upon a time", max_new_tokens=30,
                            sampling={**sampling, "seed": seed})
        for _ in range(pause_at or 0):
            session.step(gen)
        if pause_at:
            gen = session.recompute(session.park(gen).progress.to_record())
        list(session.generate(gen))
        return gen.text

    assert run(11, None) == run(11, None) == run(11, 12)
    assert run(11, None) != run(12, None)


def test_stop_string_ends_the_job_and_is_never_streamed(
        session: DecoderSession, reference: list[TokenEvent]) -> None:
    full = "".join(e.text_delta for e in reference)
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert len(stop) == 3 and full.index(stop) > 0
    gen = session.start(messages=MESSAGES, max_new_tokens=N, stop=[stop])
    events = list(session.generate(gen))
    assert gen.finish_reason == "stop" and events[-1].finished
    assert gen.text == full[: full.index(stop)]
    assert "".join(e.text_delta for e in events) == gen.text
    assert len(events) < N


def test_max_new_tokens_ends_with_length(session: DecoderSession) -> None:
    gen = session.start(prompt_ids=[5, 6, 7], max_new_tokens=3)
    events = list(session.generate(gen))
    assert [e.seq for e in events] == [0, 1, 2]
    assert events[-1].finish_reason == "length" and gen.finished
    with pytest.raises(FinishedError):
        session.step(gen)


def test_prefix_cache_hit_gives_the_cold_run_tokens(
        session: DecoderSession, reference: list[TokenEvent]) -> None:
    session.prefix_cache.clear()
    warm = session.start(messages=[MESSAGES[0], {"role": "user", "content": "Hello!"}],
                         max_new_tokens=2)
    list(session.generate(warm))  # caches the shared system prompt
    assert len(session.prefix_cache) == 1
    gen = session.start(messages=MESSAGES, max_new_tokens=N)
    assert gen.prefix_cache_tokens == gen.progress.static_prefix > 10
    assert _ids(list(session.generate(gen))) == _ids(reference)


def test_cache_prompt_lets_siblings_share_the_whole_prompt(session: DecoderSession) -> None:
    """The gateway's n > 1: every sibling but the first prefills two positions only."""
    session.prefix_cache.clear()
    texts = []
    for seed in (1, 2, 3):
        gen = session.start(messages=MESSAGES, max_new_tokens=12, cache_prompt=True,
                            sampling={"temperature": 1.0, "seed": seed})
        assert gen.progress.static_prefix == len(gen.progress.prompt_ids) - 2
        assert gen.prefix_cache_tokens == (0 if seed == 1 else gen.progress.static_prefix)
        texts.append("".join(e.text_delta for e in session.generate(gen)))
    assert len(set(texts)) == 3  # each its own seed


def test_bad_input_is_refused_clearly(session: DecoderSession, tiny_model_b: str,
                                      tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        session.start("hi", messages=MESSAGES)
    with pytest.raises(ValueError, match="role"):
        session.start(messages=[{"role": "robot", "content": "hi"}])
    with pytest.raises(ValueError, match="max_new_tokens"):
        session.start("hi", max_new_tokens=0)
    gen = session.start("hello there", max_new_tokens=8, job_id="x")
    session.step(gen)
    parked = session.park(gen)
    other = DecoderSession.load(ensure_model(tiny_model_b, shared_store()), threads=1)
    with pytest.raises(ValueError, match="parked on model"):
        other.resume(parked)
    path = parked.spill(tmp_path / "x.kvsnap")
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotCorrupt):
        ParkedState.load(path)
    # The runner still has the progress: the job resumes by recompute, nothing lost.
    resumed = session.resume(parked)
    assert resumed.kv_length == 0 and len(list(session.generate(resumed))) == 7


def test_chunked_prefill_and_replay_give_the_same_tokens(session: DecoderSession,
                                                          reference: list[TokenEvent]) -> None:
    # The runner's loop: bounded units of work (checking control between), tokens when due.
    gen = session.start(messages=MESSAGES, max_new_tokens=N, use_prefix_cache=False)
    events: list[TokenEvent] = []
    passes = 0
    while not gen.finished:
        event = session.advance(gen, 5)
        if event is None:
            passes += 1
            continue
        events.append(event)
        if len(events) == 17:  # lose the KV: the replay goes through the same loop
            session.prefix_cache.clear()
            gen = session.resume(ParkedState.from_record(session.park(gen).progress.to_record()))
    assert passes > 17  # the prompt came in chunks and the replay one token per pass
    assert _ids(events) == _ids(reference)


@pytest.mark.integration
def test_models_run_and_bench_commands(tiny_model: str, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from uniun.models.bench import BENCH_KEYS

    cmd = [sys.executable, "-m", "uniun.runtime", "models"]
    run = subprocess.run([*cmd, "run", tiny_model, "Hello!", "--max-new-tokens", "6",
                          "--temperature", "0.8", "--seed", "1", "--repeat-penalty", "1.3"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() and "6 generated" in run.stderr
    assert "'repetition_penalty': 1.3" in run.stderr and "seed 1" in run.stderr
    out = tmp_path / "bench.json"
    bench = subprocess.run([*cmd, "bench", tiny_model, "--json", "--reps", "1", "--out", str(out)],
                           capture_output=True, text=True, timeout=300)
    assert bench.returncode == 0, bench.stderr
    result = json.loads(bench.stdout)
    assert tuple(result) == BENCH_KEYS and json.loads(out.read_text()) == result
    assert all(isinstance(v, float) for v in result.values())
    assert result["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4  # 2 layers, 2 kv heads x 16
    bad = subprocess.run([*cmd, "run", tiny_model, "hi", "--top-p", "2"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--top-p: must be a number in (0, 1]" in bad.stderr


def test_an_interrupted_step_leaves_the_job_at_its_last_token_boundary(
        session: DecoderSession, reference: list[TokenEvent],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A preemption that aborts the pass in flight loses nothing and changes nothing."""
    gen = session.start(messages=MESSAGES, max_new_tokens=N, use_prefix_cache=False)
    got = [session.step(gen) for _ in range(10)]
    real_options = session._ort.RunOptions

    def already_interrupted():  # the flag set by interrupt() while the pass runs
        options = real_options()
        options.terminate = True
        return options

    monkeypatch.setattr(session._ort, "RunOptions", already_interrupted)
    kv_before = gen.kv_length
    with pytest.raises(Interrupted):
        session.step(gen)
    assert gen.kv_length == kv_before and len(gen.generated_ids) == 10
    monkeypatch.setattr(session._ort, "RunOptions", real_options)
    session.interrupt()  # no pass in flight: the next one aborts before it computes
    with pytest.raises(Interrupted):
        session.step(gen)
    assert gen.kv_length == kv_before and len(gen.generated_ids) == 10
    got += list(session.generate(gen))
    assert _ids(got) == _ids(reference)
    assert [e.seq for e in got] == list(range(len(reference)))
