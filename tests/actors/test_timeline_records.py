"""The timeline's shared bookkeeping (``actors/timeline.py``): what a job's open wait or
run becomes when it ends. The scheduler's Recorder and the simulator both keep their
segments with it, so these are the rules a real trace and a simulated one share."""

from __future__ import annotations

from uniun.actors.policy.decision import Preempt, Run
from uniun.actors.timeline import (
    MARK_KINDS,
    PROCESS_MARKS,
    Mark,
    Segment,
    Stretches,
    dispatch_marks,
    preempt_mark,
)
from uniun.protocol.jobmap import validate_job

SPEC = validate_job({"job_id": "j", "kind": "gana", "prompt": "p", "flow": "f",
                     "model_id": "m-a"}, default_model="m-a")


def run(tier: int = 3, model: str = "m-b", *, swap: bool = False, resume: bool = False) -> Run:
    return Run(job_id="j", model_id=model, resume=resume, swap=swap, token_grant=None,
               tier=tier)


def test_a_wait_ends_dispatched_in_the_tier_it_is_dispatched_from_and_a_run_follows() -> None:
    open_ = Stretches()
    open_.wait(SPEC, 10.0, tier=4, first=True)
    segment, wait = open_.dispatch(SPEC, run(tier=3), 12.0, tokens=5)
    assert segment == Segment("j", "wait", "gana", "f", 3, "m-a", 10.0, 12.0, "dispatched")
    assert wait is not None and wait.first and wait.since == 10.0
    ran = open_.end_run("j", 15.0, "slice", tokens=9)
    assert ran == Segment("j", "run", "gana", "f", 3, "m-b", 12.0, 15.0, "slice", 4)
    assert open_.end_run("j", 16.0, "done", 9) is None  # nothing open: nothing to write


def test_a_wait_that_ends_without_a_dispatch_keeps_its_tier_unless_told_another() -> None:
    open_ = Stretches()
    open_.wait(SPEC, 1.0, tier=4)
    assert open_.end_wait("j", 2.0, "cancelled") == Segment(
        "j", "wait", "gana", "f", 4, "m-a", 1.0, 2.0, "cancelled")
    open_.wait(SPEC, 3.0, tier=4, reason="preempted")
    assert open_.end_wait("j", 4.0, "failed", tier=3).tier == 3
    open_.wait(SPEC, 5.0, tier=4)
    open_.forget("j")
    assert open_.end_wait("j", 6.0, "cancelled") is None


def test_marks_of_a_preemption_and_a_dispatch() -> None:
    d = Preempt(running_job_id="j", for_job_id="chat-1", reason="preempted")
    assert preempt_mark(d, 7.0) == Mark("preempt", 7.0, "j", "preempted for chat-1")
    assert dispatch_marks(run(tier=4, swap=True), 8.0, 12, resumed=True) == [
        Mark("swap", 8.0, "j", "load m-b"), Mark("resume", 8.0, "j", "T4 after 12 tokens")]
    assert dispatch_marks(run(), 8.0, 0, resumed=False) == []
    assert PROCESS_MARKS < set(MARK_KINDS)
