"""The power governor (docs/device.md, "Power and heat") inside the real policy, on a fake
clock: on the charger background work runs as ever; on battery it gets its runner-seconds
per hour; low battery runs only deadline work; warm is a duty cycle; hot pauses it. Chat
and the foreground kind are never throttled, and every decision leaves a note."""

from __future__ import annotations

import pytest

from tests.actors.policy.harness import FakeRunner, spec, uniun
from uniun.actors.policy import Idle, PolicyConfig, PolicyError, Preempt, Run
from uniun.actors.policy.power import mode_of
from uniun.protocol.power_state import PowerState

CHARGER = PowerState(on_battery=False, percent=80.0, thermal="nominal")
BATTERY = PowerState(on_battery=True, percent=60.0, thermal="nominal")
LOW = PowerState(on_battery=True, percent=15.0, thermal="nominal")
WARM = PowerState(on_battery=False, percent=None, thermal="warm")
HOT = PowerState(on_battery=False, thermal="hot")


def _background_seconds(power: PowerState, seconds: float,
                        config: PolicyConfig | None = None) -> float:
    """Runner-seconds a long background job gets in ``seconds`` under ``power``."""
    policy, clock = uniun(config)
    policy.set_power(power)
    policy.submit(spec("g", "gana", max_new_tokens=4096))
    runner = FakeRunner(policy, clock)
    runner.decide()
    end = clock.t + seconds
    while clock.t < end - 1e-9:
        if runner.running is None:
            decision = runner.decide()
            if isinstance(decision, Idle) and runner.running is None:
                if decision.wake_at is None:
                    break
                clock.t = min(max(clock.t + 1e-6, decision.wake_at), end)
                continue
        runner.step()
    return runner.runner_seconds().get("g", 0.0)


def test_each_state_maps_to_its_mode() -> None:
    cfg = PolicyConfig()
    assert mode_of(CHARGER, cfg)[0] == "normal"
    assert mode_of(PowerState(), cfg)[0] == "normal"  # nothing known never throttles
    assert mode_of(BATTERY, cfg)[:2] == ("budget", 600 / 3600)
    assert mode_of(LOW, cfg)[0] == "deadline_only"
    assert mode_of(WARM, cfg)[:2] == ("duty", 0.5)
    assert mode_of(HOT, cfg)[0] == "paused"
    assert mode_of(PowerState(thermal="critical", on_battery=True, percent=5.0), cfg)[0] \
        == "paused"
    # Warm on battery: the smaller share wins.
    assert mode_of(PowerState(on_battery=True, percent=50.0, thermal="warm"), cfg)[1] \
        == pytest.approx(600 / 3600)


def test_on_the_charger_background_runs_all_the_time() -> None:
    assert _background_seconds(CHARGER, 60.0) == pytest.approx(60.0, abs=0.2)


def test_on_battery_background_gets_its_budget_per_hour() -> None:
    cfg = PolicyConfig(battery_runner_s_per_h=720.0)  # a fifth of the time
    got = _background_seconds(BATTERY, 600.0, cfg)
    expected = cfg.power_burst_s + 600.0 * 720.0 / 3600.0
    assert got == pytest.approx(expected, rel=0.05)


def test_warm_is_a_duty_cycle_and_hot_pauses() -> None:
    got = _background_seconds(WARM, 600.0)
    assert got == pytest.approx(5.0 + 300.0, rel=0.05)
    assert _background_seconds(HOT, 60.0) == 0.0


def test_low_battery_runs_only_deadline_work() -> None:
    policy, clock = uniun()
    policy.set_power(LOW)
    policy.submit(spec("plain", "gana"))
    assert isinstance(policy.decide(), Idle)
    policy.submit(spec("due", "gana", deadline=clock.t + 5))
    decision = policy.decide()
    assert isinstance(decision, Run) and decision.job_id == "due"


def test_chat_and_the_foreground_kind_are_never_throttled() -> None:
    policy, _ = uniun()
    policy.set_power(HOT)
    policy.set_foreground("nataraj")
    policy.submit(spec("bg", "gana"))
    policy.submit(spec("c", "chat"))
    runner = FakeRunner(policy, _)
    decision = runner.decide()
    assert isinstance(decision, Run) and decision.job_id == "c"
    runner.run_for(10.0)
    policy.submit(spec("n", "nataraj", max_new_tokens=5))
    runner.run_for(10.0)
    assert runner.outcomes == {"c": "done", "n": "done"}
    assert "bg" not in runner.outcomes


def test_a_running_background_job_is_paused_when_it_gets_hot_and_resumes_when_cool() -> None:
    policy, clock = uniun()
    policy.set_power(CHARGER)
    policy.submit(spec("g", "gana", max_new_tokens=1000))
    runner = FakeRunner(policy, clock)
    runner.decide()
    runner.run_for(1.0)
    assert policy.set_power(HOT) is True
    decision = runner.decide()
    assert isinstance(decision, Preempt) and decision.reason == "budget"
    runner.run_for(5.0)
    assert runner.running is None
    assert policy.power_status()["mode"] == "paused"
    policy.set_power(CHARGER)
    assert isinstance(runner.decide(), Run)
    notes = [why for _, why in policy.take_power_notes()]
    assert notes[0] == "paused: thermal hot" and "normal: on the charger" in notes
    assert any(n.startswith("pause: thermal hot") for n in notes)
    assert any(n.startswith("hold background") for n in notes)
    assert policy.take_power_notes() == []  # drained


def test_the_same_facts_change_nothing_and_bad_input_is_refused() -> None:
    policy, _ = uniun()
    assert policy.set_power(BATTERY) is True
    assert policy.set_power(BATTERY) is False
    with pytest.raises(PolicyError):
        policy.set_power({"on_battery": True})  # type: ignore[arg-type]
    assert policy.power_status()["mode"] == "budget"
    with pytest.raises(ValueError, match="warm_duty"):
        PolicyConfig(warm_duty=0.0)
    with pytest.raises(ValueError, match="power_resume_s"):
        PolicyConfig(power_resume_s=9.0, power_burst_s=5.0)
