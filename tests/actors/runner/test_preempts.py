"""Which scheduler commands make the runner's pump thread abort the active job's pass."""

from __future__ import annotations

from uniun.actors.runner.pacing import preempts
from uniun.protocol import runner_records as rp


def test_commands_that_take_the_model_from_the_active_job_abort_its_pass() -> None:
    other = rp.Start(job_id="chat", model_id="m", job_kind="chat", prompt="hi", messages=None,
                     max_new_tokens=4, sampling={})
    assert preempts(rp.Pause(job_id="bg"), "bg") and preempts(rp.Cancel(job_id="bg"), "bg")
    assert preempts(other, "bg") and preempts(rp.Resume(job_id="old", generated=3), "bg")
    assert preempts(rp.Load(model_id="m2"), "bg")


def test_commands_about_other_jobs_leave_the_active_pass_alone() -> None:
    assert not preempts(rp.Pause(job_id="other"), "bg")
    assert not preempts(rp.Cancel(job_id="other"), "bg")
    assert not preempts(rp.Drop(job_id="other"), "bg")
    assert not preempts(rp.Resume(job_id="bg", generated=3), "bg")
