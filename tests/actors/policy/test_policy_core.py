"""The policy's contract with its host: inputs, reports, errors, and the fcfs baseline."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from tests.actors.policy.harness import MODEL, FakeClock, FakeRunner, spec, uniun
from uniun.actors.policy import (
    CancelOutcome,
    DuplicateJob,
    Idle,
    IllegalTransition,
    JobStatus,
    PolicyConfig,
    PolicyError,
    Preempt,
    ReportOutcome,
    Run,
    UnknownJob,
    make_policy,
)
from uniun.protocol.errors import InvalidField


def test_submit_answers_the_tier_of_each_kind() -> None:
    policy, clock = uniun()
    policy.set_foreground("nataraj")
    assert policy.submit(spec("c", "chat")) == 0
    assert policy.submit(spec("n", "nataraj")) == 1
    assert policy.submit(spec("e", "extract")) == 2
    assert policy.submit(spec("g-late", "gana", deadline=clock.t - 1)) == 3
    assert policy.submit(spec("g", "gana")) == 4
    assert policy.status()["queues"] == {"T0": ["c"], "T1": ["n"], "T2": ["e"],
                                         "T3": ["g-late"], "T4": ["g"]}


def test_duplicate_or_invalid_job_is_rejected_naming_the_field_and_changes_nothing() -> None:
    policy, _ = uniun()
    policy.submit(spec("j1", "gana"))
    before = policy.status()
    with pytest.raises(DuplicateJob) as err:
        policy.submit(spec("j1", "nataraj"))
    assert err.value.field == "job_id" and err.value.to_body()["code"] == "invalid_field"
    bad = dataclasses.replace(spec("j2", "gana"), max_new_tokens=0)
    with pytest.raises(InvalidField) as err2:
        policy.submit(bad)
    assert err2.value.field == "max_new_tokens"
    with pytest.raises(InvalidField) as err3:
        policy.submit(spec("j3", "gana"), arrival=float("nan"))
    assert err3.value.field == "arrival"
    with pytest.raises(InvalidField):
        policy.submit({"job_id": "raw-map", "kind": "chat"})  # type: ignore[arg-type]
    assert policy.status() == before and policy.live_count() == 1


def test_reports_that_do_not_fit_raise_a_named_error_and_change_nothing() -> None:
    policy, _ = uniun()
    policy.submit(spec("q", "gana"))
    with pytest.raises(IllegalTransition) as err:
        policy.on_finished("q", 1.0)
    assert "QUEUED" in str(err.value) and err.value.job_id == "q"
    with pytest.raises(UnknownJob):
        policy.on_tokens("nobody", 1, 0.1)
    assert policy.job("q").status is JobStatus.QUEUED
    run = policy.decide()
    assert isinstance(run, Run)
    with pytest.raises(PolicyError):
        policy.on_tokens("q", 1, -1.0)  # negative runner time
    assert policy.job("q").tokens == 0
    policy.on_finished("q", 0.5)
    with pytest.raises(UnknownJob):
        policy.on_finished("q", 0.5)  # ends exactly once


def test_cancel_removes_queued_stops_running_and_reports_unknown() -> None:
    policy, clock = uniun()
    runner = FakeRunner(policy, clock)
    policy.submit(spec("a", "gana", max_new_tokens=50))
    policy.submit(spec("b", "gana", max_new_tokens=50))
    runner.decide()
    assert policy.cancel("b") is CancelOutcome.REMOVED
    assert policy.cancel("b") is CancelOutcome.NOT_FOUND
    assert policy.cancel("zzz") is CancelOutcome.NOT_FOUND
    runner.cancel("a")
    assert policy.job("a").status is JobStatus.CANCELLING
    assert isinstance(policy.decide(), Idle)  # no second order for a stopping job
    runner.step()
    assert runner.outcomes == {"a": "cancelled"} and policy.job("b") is None
    assert policy.live_count() == 0 and policy.status()["running"] is None


def test_cancel_that_races_a_preemption_ends_as_cancelled() -> None:
    policy, _clock = uniun()
    policy.submit(spec("n", "nataraj"))
    policy.decide()
    policy.on_started("n")
    policy.submit(spec("c", "chat"))
    assert isinstance(policy.decide(), Preempt)
    assert policy.cancel("n") is CancelOutcome.STOP_RUNNING
    assert policy.on_paused("n", 0.1, "preempted") is ReportOutcome.CANCELLED
    assert policy.job("n") is None
    assert policy.decide().job_id == "c"  # type: ignore[union-attr]


def test_chat_never_preempts_chat_and_an_interrupted_chat_is_an_error_not_a_rerun() -> None:
    policy, _clock = uniun()
    policy.submit(spec("c1", "chat"))
    assert isinstance(policy.decide(), Run)
    policy.on_started("c1")
    policy.submit(spec("c2", "chat"))
    policy.set_foreground("chat")
    assert isinstance(policy.decide(), Idle)
    outcome = policy.on_paused("c1", 0.2, "swap")  # e.g. the runner had to stop it
    assert outcome is ReportOutcome.CHAT_INTERRUPTED
    assert policy.job("c1") is None  # ended, never queued again
    assert policy.decide().job_id == "c2"  # type: ignore[union-attr]


def test_a_preempted_job_goes_to_the_front_of_its_tier() -> None:
    policy, clock = uniun()
    runner = FakeRunner(policy, clock)
    policy.submit(spec("e1", "extract", max_new_tokens=100))
    runner.decide()
    runner.run_for(0.5)
    policy.submit(spec("e2", "extract"))
    policy.submit(spec("c", "chat", max_new_tokens=3))
    runner.decide()
    runner.step()
    assert policy.status()["queues"]["T2"] == ["e1", "e2"]
    runner.run_for(0.5)
    assert runner.timeline[-1].job_id == "e1"


def test_failed_runner_requeues_background_work_but_ends_chat() -> None:
    policy, _clock = uniun()
    policy.submit(spec("g", "gana"))
    policy.decide()
    policy.on_started("g")
    policy.on_tokens("g", 3, 0.3)
    assert policy.on_failed("g", 0.0, requeue=True) is ReportOutcome.REQUEUED
    run = policy.decide()
    assert isinstance(run, Run) and run.job_id == "g" and run.resume
    policy.on_failed("g", 0.0)
    assert policy.job("g") is None
    policy.submit(spec("c", "chat"))
    policy.decide()
    assert policy.on_failed("c", 0.1, requeue=True) is ReportOutcome.FAILED


def test_wall_clock_deadline_is_converted_once_to_the_policy_clock() -> None:
    clock = FakeClock(50.0)
    wall = FakeClock(1_700_000_000.0)
    policy = make_policy("uniun", None, clock, wall_clock=wall)
    policy.on_model_loaded(MODEL)
    policy.submit(spec("g", "gana", deadline=wall.t + 30.0))
    assert policy.job("g").deadline_at == 80.0
    wall.advance(3600.0)  # the wall clock jumps (NTP, a time zone trip): no effect
    clock.t = 79.9
    assert policy.status()["queues"]["T4"] == ["g"]
    clock.t = 80.0
    assert policy.status()["queues"]["T3"] == ["g"]
    policy.submit(spec("g2", "gana", deadline=wall.t + 30.0), deadline_at=65.0)
    assert policy.job("g2").deadline_at == 65.0


def test_swap_is_requested_when_the_model_differs_and_counted() -> None:
    policy, _clock = uniun(model=None)
    policy.submit(spec("c", "chat", model_id="a"))
    run = policy.decide()
    assert isinstance(run, Run) and run.swap and run.model_id == "a"
    policy.on_finished("c", 0.1)
    policy.submit(spec("c2", "chat", model_id="a"))
    assert not policy.decide().swap  # type: ignore[union-attr]
    assert policy.status()["swaps"] == 1 and policy.status()["loaded_model"] == "a"


def test_fcfs_is_one_fifo_without_preemption_or_affinity() -> None:
    policy, clock = uniun(name="fcfs")
    runner = FakeRunner(policy, clock)
    policy.submit(spec("g", "gana", max_new_tokens=20))
    policy.submit(spec("e", "extract", max_new_tokens=5, model_id="other"))
    policy.submit(spec("c", "chat", max_new_tokens=5))
    runner.decide()
    policy.set_foreground("chat")
    assert isinstance(runner.decide(), Idle)  # chat waits its turn: no preemption
    assert policy.status()["fifo"] == ["e", "c"]
    runner.run_until_idle()
    runs = [d for d in runner.decisions if isinstance(d, Run)]
    assert [d.job_id for d in runs] == ["g", "e", "c"]
    assert [d.swap for d in runs] == [False, True, True]  # no batching either
    assert policy.status()["policy"] == "fcfs" and policy.status()["preemptions"] == 0


def test_factory_and_config_reject_unknown_names_and_bad_values() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("lottery")
    with pytest.raises(ValueError, match="slice_s"):
        PolicyConfig(slice_s=0)
    with pytest.raises(ValueError, match="t2_share_max"):
        PolicyConfig(t2_share_max=1.5)
    with pytest.raises(ValueError, match="flow_weights"):
        PolicyConfig(flow_weights={"gana": -1.0})
    with pytest.raises(InvalidField):
        make_policy("uniun").set_lifecycle("asleep")


def test_flow_weights_divide_the_charge_and_new_flows_start_at_min_vruntime() -> None:
    config = PolicyConfig(flow_weights={"heavy": 2.0})
    policy, clock = uniun(config)
    runner = FakeRunner(policy, clock)
    policy.submit(spec("h", "gana", flow="heavy", max_new_tokens=40))
    policy.submit(spec("l", "gana", flow="light", max_new_tokens=40))
    runner.run_until_idle()
    vr = policy.status()["vruntime"]
    assert vr["heavy"] == pytest.approx(2.0) and vr["light"] == pytest.approx(4.0)
    policy.submit(spec("new", "gana", flow="newcomer"))
    assert policy.status()["vruntime"]["newcomer"] == pytest.approx(
        policy.status()["min_vruntime"])


def test_vruntimes_halve_every_period() -> None:
    config = PolicyConfig()
    policy, clock = uniun(config)
    runner = FakeRunner(policy, clock)
    policy.submit(spec("g", "gana", max_new_tokens=30))
    runner.run_until_idle()
    before = policy.status()["vruntime"]["gana"]
    clock.advance(config.halving_period_s)
    assert policy.status()["vruntime"]["gana"] == pytest.approx(before / 2)


def test_policy_and_simulator_import_no_actor_transport_or_runtime_libraries() -> None:
    code = ("import sys, uniun.actors.policy, uniun.actors.sim.simulator, uniun.actors.sim.trace\n"
            "bad = sorted(m for m in sys.modules\n"
            "             if m.split('.')[0] in ('pykka', 'zmq', 'onnxruntime', 'onnx'))\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == ""


def test_a_long_run_keeps_the_policy_small() -> None:
    policy, clock = uniun()
    for n in range(50):
        policy.submit(spec(f"e{n}", "extract", deadline=clock.t + 1e6))
    for n in range(50, 3050):  # 3,000 jobs through one never-empty queue
        run = policy.decide()
        assert isinstance(run, Run)
        policy.on_finished(run.job_id, 0.01)
        clock.advance(0.01)
        policy.submit(spec(f"e{n}", "extract", deadline=clock.t + 1e6))
    index = policy._index  # white-box: the lazy heaps must not keep dead entries
    assert max(len(b._waits) for b in index.buckets.values()) <= 2 * 50 + 64
    assert len(index._promotions) <= 2 * 50 + 64
    assert policy.live_count() == 50
