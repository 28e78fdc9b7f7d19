"""The runner's job bookkeeping (``actors/runner/jobs.py``) without a process or a model.

:class:`RunnerJobs` is fed what ``RunnerWorker`` feeds it (a scheduler command, or a
``_Step``) and the reports it sends are read back in order. The model is the fake of
``fake_session.py`` (token ``seq`` is id ``100 + seq``, text ``"t<seq> "``); the
generations, the parking lot and the spill files are the real ones. The scheduler core
is driven against the same ``RunnerJobs`` in ``tests/actors/scheduler/``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.actors.policy.harness import FakeClock
from tests.actors.runner.fake_session import FakeSession, text_of, texts, token_id
from uniun.actors.runner.jobs import RunnerJobs
from uniun.actors.runner.pacing import PASS_FLOOR, PASS_TARGET_S, PREFILL_CHUNK, Pacing
from uniun.models.kv import JobProgress, ParkedState
from uniun.models.parking import ParkingLot
from uniun.protocol import runner_records as rp
from uniun.runtime.runner_main import token_pace

MODEL = "m-chat"


@dataclass
class Bench:
    """A ``RunnerJobs`` wired like the worker wires it: ``reports`` is what it sent,
    ``steps_asked`` how many ``_Step`` messages it told itself."""

    spill_dir: Path
    preload: str | None = MODEL
    pace_s: float = 0.0  # the test hook's least seconds per token
    broken: set[str] = field(default_factory=set)  # models whose load fails
    reports: list[rp.Report] = field(default_factory=list)
    steps_asked: int = 0
    starts_seen: list[str] = field(default_factory=list)
    sized_for: list[str] = field(default_factory=list)  # models the parking was sized for
    clock: FakeClock = field(default_factory=FakeClock)

    def __post_init__(self) -> None:
        self.lot = ParkingLot(spill_dir=self.spill_dir)
        self.sessions: list[FakeSession] = []
        self.jobs = RunnerJobs(store=None, threads=1, parking=self.lot, preload=self.preload,
                               report=self.reports.append, step_again=self._step_again,
                               open_session=self._open, clock=self.clock,
                               pacing=Pacing(token_pace_s=self.pace_s, clock=self.clock,
                                             sleep=self.clock.advance),
                               before_start=lambda cmd: self.starts_seen.append(cmd.job_id),
                               size_parking=self._size_parking)

    def _size_parking(self, session: FakeSession, lot: ParkingLot) -> None:
        assert lot is self.lot
        self.sized_for.append(session.model_id)
        lot.max_bytes = 1000 * len(self.sized_for)

    def _open(self, model_id: str) -> FakeSession:
        if model_id in self.broken:
            raise FileNotFoundError(f"no model {model_id}")
        self.sessions.append(FakeSession(model_id))
        return self.sessions[-1]

    def _step_again(self) -> None:
        self.steps_asked += 1

    @property
    def session(self) -> FakeSession:
        return self.jobs.session

    def take(self) -> list[rp.Report]:
        out, self.reports[:] = list(self.reports), []
        return out

    def handle(self, cmd: rp.Command) -> list[rp.Report]:
        self.jobs.handle(cmd)
        return self.take()

    def step(self, n: int = 1) -> list[rp.Report]:
        for _ in range(n):
            self.clock.advance(0.01)
            self.jobs.step()
        return self.take()


def start(job_id: str, max_new_tokens: int = 5, **fields: Any) -> rp.Start:
    base: dict[str, Any] = {"job_id": job_id, "model_id": MODEL, "job_kind": "nataraj",
                            "prompt": "three word prompt", "messages": None,
                            "max_new_tokens": max_new_tokens, "sampling": {}}
    return rp.Start(**{**base, **fields})


def tokens(reports: list[rp.Report]) -> list[tuple[int, int, str]]:
    return [(r.seq, r.token_id, r.text) for r in reports if isinstance(r, rp.Token)]


def kinds(reports: list[rp.Report]) -> list[str]:
    return [r.kind for r in reports]


@pytest.fixture
def bench(tmp_path: Path) -> Bench:
    b = Bench(tmp_path / "spill")
    b.jobs.preload_model()
    return b


# ---- a job from start to end -----------------------------------------------------------


def test_a_fresh_start_streams_every_token_once_and_finishes_at_max_new_tokens(
        bench: Bench) -> None:
    [started] = bench.handle(start("a", max_new_tokens=3))
    assert started == rp.Started(job_id="a", resumed=False, prompt_tokens=3, recomputed=0,
                                 seed=7)
    assert bench.starts_seen == ["a"] and bench.steps_asked == 1
    out = bench.step(3)
    assert tokens(out) == [(s, token_id(s), text_of(s)) for s in range(3)]
    finished = out[-1]
    assert finished == rp.Finished(job_id="a", finish_reason="length", prompt_tokens=3,
                                   generated=3, seconds=0.0)
    assert bench.jobs.active is None and bench.steps_asked == 3  # none after the end
    assert bench.step() == []  # a stale _Step is harmless


def test_token_seconds_are_runner_time_on_the_injected_clock(bench: Bench) -> None:
    bench.handle(start("a", max_new_tokens=2))
    bench.clock.advance(0.5)  # the runner waited before its first step
    first, second = [r for r in bench.step(2) if isinstance(r, rp.Token)]
    assert first.seconds == pytest.approx(0.51) and second.seconds == pytest.approx(0.01)


def _prefill_passes(bench: Bench, words: int) -> int:
    """Start a job with a ``words``-token prompt; _Steps until its first token, which
    must come (a bounded loop: a bug fails, it does not hang)."""
    bench.handle(start("long", prompt="w " * words))
    asked = bench.steps_asked
    for passes in range(words):
        out = bench.step()
        if out:
            assert bench.steps_asked == asked + passes + 1
            assert tokens(out) == [(0, token_id(0), text_of(0))]
            return passes
    raise AssertionError("no first token after a pass per prompt position")


def test_a_long_prompt_is_prefilled_in_chunks_with_control_checked_between(
        bench: Bench) -> None:
    words = 12 * PASS_FLOOR  # no pass timed yet (the fake's are free): probe-sized passes
    assert _prefill_passes(bench, words) == (words - 1) // PASS_FLOOR


@pytest.mark.parametrize("seconds_per_position", [0.001, 0.002, 0.0025])
def test_prompt_passes_are_sized_from_the_models_measured_cost(
        bench: Bench, seconds_per_position: float) -> None:
    """A pass of ~PASS_TARGET_S at the cost the runner measured: 50, 25 and 20 positions."""
    bench.jobs.pacing.cost.observe(100, 100 * seconds_per_position)
    chunk = round(PASS_TARGET_S / seconds_per_position)
    assert bench.jobs.pacing.positions() == chunk
    words = 5 * chunk + 3
    assert _prefill_passes(bench, words) == (words - 1) // chunk


def test_a_token_pace_makes_a_segments_tokens_take_at_least_that_long(
        tmp_path: Path) -> None:
    bench = Bench(tmp_path, pace_s=0.05)
    bench.jobs.preload_model()
    bench.handle(start("slow", max_new_tokens=4))
    out = bench.step(2)  # each step's own work takes 0.01 s on the clock
    bench.clock.advance(0.2)  # a slow step is not held back, and the next catches up
    out += bench.step(2)
    assert [r.seconds for r in out if isinstance(r, rp.Token)] == pytest.approx(
        [0.05, 0.05, 0.21, 0.01])
    assert out[-1].kind == "finished"
    bench.handle(start("again", max_new_tokens=1))  # a new segment is paced from its start
    assert [r.seconds for r in bench.step() if isinstance(r, rp.Token)] == pytest.approx(
        [0.05])


def test_the_pace_hook_reads_seconds_and_ignores_anything_else() -> None:
    assert token_pace("0.002") == 0.002 and token_pace(None) == 0.0 and token_pace("") == 0.0
    for bad in ("fast", "-1", "nan", "1e9"):
        assert token_pace(bad) == 0.0, bad


# ---- pause, grant, resume ----------------------------------------------------------------


def test_a_spent_grant_parks_the_job_and_a_resume_continues_after_its_tokens(
        bench: Bench) -> None:
    bench.handle(start("g", max_new_tokens=6, grant=2))
    out = bench.step(2)
    assert kinds(out) == ["token", "token", "paused"]
    assert out[-1] == rp.Paused(job_id="g", generated=2, seconds=0.0, grant_spent=True)
    assert bench.jobs.active is None and bench.jobs.held() == {"g": 2}
    assert bench.jobs.stats[0] == 1  # one snapshot parked (the heartbeat's count)

    [started] = bench.handle(rp.Resume(job_id="g", generated=2))
    assert started.resumed is True and started.seed == 7
    out = bench.step(4)
    assert [t[0] for t in tokens(out)] == [2, 3, 4, 5]
    assert out[-1].kind == "finished" and bench.jobs.held() == {}


def test_pause_parks_only_the_job_it_names(bench: Bench) -> None:
    bench.handle(start("a", max_new_tokens=9))
    bench.step(2)
    assert bench.handle(rp.Pause(job_id="other")) == []
    assert bench.jobs.active is not None
    [paused] = bench.handle(rp.Pause(job_id="a"))
    assert paused == rp.Paused(job_id="a", generated=2, seconds=0.0, grant_spent=False)
    assert bench.handle(rp.Pause(job_id="a")) == []  # already parked: nothing to say


def test_a_resume_at_another_count_is_unknown_and_the_parked_job_stays(bench: Bench) -> None:
    bench.handle(start("a", max_new_tokens=9, grant=3))
    bench.step(3)
    assert bench.handle(rp.Resume(job_id="a", generated=2)) == [rp.Unknown(job_id="a")]
    assert bench.handle(rp.Resume(job_id="nope", generated=0)) == [rp.Unknown(job_id="nope")]
    assert bench.jobs.held() == {"a": 3}  # the scheduler may still ask for it as it is


def test_a_start_while_another_job_runs_parks_that_job_first(bench: Bench) -> None:
    bench.handle(start("bg", max_new_tokens=9))
    bench.step(3)
    out = bench.handle(start("chat", max_new_tokens=2))
    assert kinds(out) == ["paused", "started"]
    assert out[0].job_id == "bg" and out[1].job_id == "chat"
    assert bench.jobs.held() == {"bg": 3}


# ---- starts that continue a job ----------------------------------------------------------


def test_a_start_with_streamed_tokens_recomputes_them_and_continues_after_them(
        bench: Bench) -> None:
    cmd = start("x", max_new_tokens=6, tokens=[token_id(s) for s in range(4)], text=texts(4),
                seed=9)
    [started] = bench.handle(cmd)
    assert started.resumed is True and started.seed == 9
    assert started.recomputed == 3 + 4 - 1  # prompt and tokens fed again, less the last
    out = bench.step(2)
    assert [t[0] for t in tokens(out)] == [4, 5]
    assert out[-1] == rp.Finished(job_id="x", finish_reason="length", prompt_tokens=3,
                                  generated=6, seconds=0.0)


def test_a_start_after_fewer_tokens_than_the_runner_holds_continues_after_those(
        bench: Bench) -> None:
    # The scheduler died after streaming 2 tokens; the runner had made 4 by then.
    bench.handle(start("x", max_new_tokens=8, grant=4))
    bench.step(4)
    [started] = bench.handle(start("x", max_new_tokens=8, tokens=[token_id(0), token_id(1)],
                                   text=texts(2)))
    assert started.resumed is True
    assert tokens(bench.step()) == [(2, token_id(2), text_of(2))]  # no token twice, none lost


def test_a_start_whose_tokens_already_complete_the_job_finishes_without_running(
        bench: Bench) -> None:
    cmd = start("d", max_new_tokens=3, tokens=[token_id(s) for s in range(3)], text=texts(3))
    assert bench.handle(cmd) == [rp.Finished(job_id="d", finish_reason="length",
                                             prompt_tokens=3, generated=3, seconds=0.0)]
    assert bench.jobs.active is None


def test_a_start_the_model_refuses_is_failed_and_the_runner_carries_on(bench: Bench) -> None:
    [failed] = bench.handle(start("big", prompt="w " * 600))
    assert isinstance(failed, rp.Failed) and "does not fit" in failed.message
    assert bench.jobs.active is None
    assert kinds(bench.handle(start("ok", max_new_tokens=1))) == ["started"]


# ---- cancel and drop ---------------------------------------------------------------------


def test_cancel_stops_the_active_job_and_forgets_a_parked_one(bench: Bench) -> None:
    bench.handle(start("parked", max_new_tokens=9, grant=1))
    bench.step()
    bench.handle(start("run", max_new_tokens=9))
    bench.step(2)
    bench.clock.advance(0.25)
    assert bench.handle(rp.Cancel(job_id="run")) == [
        rp.Cancelled(job_id="run", seconds=pytest.approx(0.25))]
    assert bench.jobs.active is None
    assert bench.handle(rp.Cancel(job_id="parked")) == []  # nothing ran: nothing to report
    assert bench.jobs.held() == {} and bench.step() == []


def test_drop_leaves_the_active_job_alone_and_forgets_a_parked_one(bench: Bench) -> None:
    bench.handle(start("parked", max_new_tokens=9, grant=1))
    bench.step()
    bench.handle(start("run", max_new_tokens=9))
    assert bench.handle(rp.Drop(job_id="run")) == []
    assert bench.jobs.active is not None  # a Pause or Cancel for it will follow
    bench.handle(rp.Drop(job_id="parked"))
    assert bench.jobs.held() == {}


# ---- the model -------------------------------------------------------------------------------


def test_preload_loads_and_warms_the_model_without_reporting(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    bench.jobs.preload_model()
    assert bench.jobs.model_id == MODEL and bench.session.passes > 0  # the warm-up ran
    assert bench.reports == []
    broken = Bench(tmp_path, broken={MODEL})
    broken.jobs.preload_model()  # logged, not reported: Hello says no model
    assert broken.jobs.model_id is None and broken.reports == []


def test_load_reports_the_model_and_a_failed_load_is_load_failed(bench: Bench) -> None:
    assert bench.handle(rp.Load(model_id=MODEL)) == [rp.ModelLoaded(model_id=MODEL, seconds=0.0)]
    first = bench.session
    [loaded] = bench.handle(rp.Load(model_id="m-other"))
    assert loaded.model_id == "m-other" and first.unloaded and bench.jobs.model_id == "m-other"
    bench.broken.add("m-bad")
    [failed] = bench.handle(rp.Load(model_id="m-bad"))
    assert isinstance(failed, rp.LoadFailed) and "no model m-bad" in failed.message
    assert bench.jobs.model_id is None


def test_a_load_parks_the_running_job_first(bench: Bench) -> None:
    bench.handle(start("a", max_new_tokens=9))
    bench.step()
    assert kinds(bench.handle(rp.Load(model_id="m-other"))) == ["paused", "loaded"]


def test_a_start_on_a_model_that_cannot_load_is_failed(bench: Bench) -> None:
    bench.broken.add("m-bad")
    assert bench.handle(start("a", model_id="m-bad")) == [
        rp.Failed(job_id="a", message="model m-bad failed to load")]


def test_a_start_on_another_model_swaps_to_it(bench: Bench) -> None:
    [started] = bench.handle(start("a", model_id="m-other", max_new_tokens=1))
    assert started.kind == "started" and bench.jobs.model_id == "m-other"
    assert bench.sessions[0].unloaded


def test_a_generation_error_is_reported_failed_and_the_job_let_go(bench: Bench) -> None:
    bench.handle(start("a", max_new_tokens=9))
    bench.step()
    bench.session.fail_next = RuntimeError("onnxruntime said no")
    [failed] = bench.step()
    assert isinstance(failed, rp.Failed) and failed.message == "onnxruntime said no"
    assert bench.jobs.active is None and bench.jobs.held() == {}


def test_an_interrupted_pass_is_retried_on_the_next_step(bench: Bench) -> None:
    bench.handle(start("a", max_new_tokens=9))
    asked = bench.steps_asked
    bench.session.interrupt_next = True
    assert bench.step() == [] and bench.steps_asked == asked + 1
    assert tokens(bench.step()) == [(0, token_id(0), text_of(0))]


def test_a_command_it_does_not_handle_is_logged_not_raised(bench: Bench) -> None:
    assert bench.handle(rp.Heartbeat(boot="b")) == []


# ---- spill files of a previous runner ---------------------------------------------------------


def _spill(folder: Path, job_id: str, generated: int, max_new_tokens: int = 9) -> Path:
    progress = JobProgress(prompt_ids=[1, 1, 1], max_new_tokens=max_new_tokens, seed=5,
                           generated_ids=[token_id(s) for s in range(generated)],
                           text=texts(generated), job_id=job_id, model_id=MODEL)
    folder.mkdir(parents=True, exist_ok=True)
    return ParkedState(progress).spill(folder / f"{job_id}.kvsnap")


def test_spill_files_of_a_dead_runner_are_offered_and_resumed_then_removed(
        tmp_path: Path) -> None:
    kept = _spill(tmp_path, "kept", 3)
    (tmp_path / "garbage.kvsnap").write_bytes(b"not a snapshot")
    bench = Bench(tmp_path)
    bench.jobs.find_orphans(tmp_path)
    assert not (tmp_path / "garbage.kvsnap").exists()  # unreadable: removed at start
    assert bench.jobs.held() == {"kept": 3} and bench.jobs.stats[0] == 1
    [started] = bench.handle(rp.Resume(job_id="kept", generated=3))
    assert started.resumed is True and started.seed == 5 and not kept.exists()
    assert [t[0] for t in tokens(bench.step(2))] == [3, 4]


def test_a_spill_file_dropped_by_the_scheduler_is_deleted(tmp_path: Path) -> None:
    stray = _spill(tmp_path, "stray", 2)
    bench = Bench(tmp_path)
    bench.jobs.find_orphans(tmp_path)
    bench.handle(rp.Drop(job_id="stray"))
    assert not stray.exists() and bench.jobs.held() == {}


def test_a_spill_file_whose_payload_is_damaged_is_unknown_on_resume(tmp_path: Path) -> None:
    # A header that promises a KV payload the file does not have (a runner killed mid-write
    # of a file written in place, or a damaged disk).
    progress = JobProgress(prompt_ids=[1], max_new_tokens=9, generated_ids=[token_id(0)],
                           text=text_of(0), job_id="torn", model_id=MODEL)
    header = json.dumps({"version": 1, "progress": progress.to_record(), "crc32": 0,
                         "kv": {"length": 4, "layers": 1, "kv_heads": 1, "head_dim": 2,
                                "dtype": "float32"}}).encode()
    path = tmp_path / "torn.kvsnap"
    path.write_bytes(b"UNIUNKV1" + struct.pack("<I", len(header)) + header)
    bench = Bench(tmp_path)
    bench.jobs.find_orphans(tmp_path)
    assert bench.jobs.held() == {"torn": 1}
    assert bench.handle(rp.Resume(job_id="torn", generated=1)) == [rp.Unknown(job_id="torn")]
    assert not path.exists()  # the scheduler now sends a Start that recomputes
    assert kinds(bench.handle(start("torn", tokens=[token_id(0)], text=text_of(0)))) == [
        "started"]


def test_the_parking_is_sized_for_each_model_loaded_and_its_costs_forgotten(
        bench: Bench) -> None:
    assert bench.sized_for == [MODEL] and bench.lot.max_bytes == 1000
    bench.jobs.pacing.cost.observe(100, 1.0)
    bench.handle(rp.Load(model_id="m-other"))
    assert bench.sized_for == [MODEL, "m-other"] and bench.lot.max_bytes == 2000
    assert bench.jobs.pacing.cost.per_position_s is None  # the new model's costs are unknown


def test_a_preempting_command_aborts_the_active_pass_and_a_new_job_starts_clean(
        bench: Bench) -> None:
    bench.handle(start("bg", max_new_tokens=9))
    bench.step()
    assert not bench.jobs.preempt(rp.Pause(job_id="other"))  # not the active job
    assert not bench.session.interrupt_next
    assert bench.jobs.preempt(rp.Pause(job_id="bg"))  # the pump thread, as it arrives
    assert bench.step() == []  # the pass in flight (here: the next) aborts, nothing lost
    [paused] = bench.handle(rp.Pause(job_id="bg"))
    assert isinstance(paused, rp.Paused) and paused.generated == 1
    bench.jobs.preempt(rp.Load(model_id=MODEL))  # nothing active: nothing to abort
    bench.session.interrupt()  # one that came too late for bg ...
    bench.handle(start("chat", max_new_tokens=1))
    assert tokens(bench.step()) == [(0, token_id(0), text_of(0))]  # ... spares the chat


def test_a_chats_prompt_is_fed_in_the_longest_passes_whatever_the_cost(bench: Bench) -> None:
    """Nothing preempts a chat: every extra pass would only add its overhead to the
    chat's time to first token."""
    bench.jobs.pacing.cost.observe(100, 100 * 0.002)  # a background pass: 25 positions
    assert bench.jobs.pacing.positions() == 25
    words = 4 * PREFILL_CHUNK + 3
    bench.handle(start("chat", prompt="w " * words, job_kind="chat"))
    passes = 0
    while not tokens(bench.step()):
        passes += 1
    assert passes == (words - 1) // PREFILL_CHUNK
