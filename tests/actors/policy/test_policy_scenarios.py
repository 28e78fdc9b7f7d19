"""The eight scenarios of the seed's test plan, against the pure policy on a fake clock.

Each test is one row of the table in ``seeds/uniun-scheduler-design.txt`` ("test plan"),
asserting its "expected behaviour" column (scenario 8 at the level of the policy: in the
background lifecycle with no queued work nothing is dispatched, and grants are 25 %).
"""

from __future__ import annotations

import itertools

from tests.actors.policy.harness import MODEL, FakeRunner, spec, uniun
from uniun.actors.policy import Idle, PolicyConfig, Preempt, ReportOutcome, Run
from uniun.actors.sim.simulator import CostModel, Simulation
from uniun.actors.sim.trace import Submit


def test_scenario_1_chat_preempts_running_nataraj_within_one_token() -> None:
    policy, clock = uniun()
    runner = FakeRunner(policy, clock, step_s=0.0093)
    policy.submit(spec("nataraj-1", "nataraj", max_new_tokens=500))
    assert isinstance(runner.decide(), Run)
    runner.run_for(1.0)
    assert policy.submit(spec("chat-1", "chat")) == 0
    decision = runner.decide()  # the scheduler asks at once, on the chat's arrival
    assert decision == Preempt("nataraj-1", "chat-1", "preempted", decision.wake_at)
    runner.step()  # the next token boundary: nataraj pauses, chat starts
    assert runner.timeline[-2].how == "paused:preempted"
    started = runner.timeline[-1]
    assert started.job_id == "chat-1" and started.start - 1.0 - 1000.0 < 0.5
    assert policy.status()["queues"]["T4"] == ["nataraj-1"]  # re-queued, not dropped
    runner.run_until_idle()
    resumed = [d for d in runner.decisions if isinstance(d, Run) and d.job_id == "nataraj-1"]
    assert [d.resume for d in resumed] == [False, True]
    assert runner.produced["nataraj-1"] == 500 and runner.outcomes["nataraj-1"] == "done"


def test_scenario_2_two_ganas_alternate_by_vruntime() -> None:
    config = PolicyConfig()
    policy, clock = uniun(config)
    runner = FakeRunner(policy, clock, step_s=0.1)
    policy.submit(spec("gana-a", "gana", flow="gana:a", max_new_tokens=4000))
    policy.submit(spec("gana-b", "gana", flow="gana:b", max_new_tokens=4000))
    runner.run_for(120.0)
    turns = [seg for seg in runner.timeline]
    assert {seg.job_id for seg in turns} == {"gana-a", "gana-b"}
    # Neither monopolises: each turn ends within a slice of the granularity being crossed.
    bound = config.granularity_s * 2 + config.slice_s + 0.5
    for seg in turns[:-1]:
        assert seg.end is not None and seg.end - seg.start <= bound, seg
        assert seg.how == "paused:slice"
    assert all(a.job_id != b.job_id for a, b in itertools.pairwise(turns))  # alternating
    used = runner.runner_seconds()
    assert abs(used["gana-a"] - used["gana-b"]) <= bound
    assert len(turns) >= 120 / bound


def test_scenario_3_gana_past_its_deadline_enters_t3_and_preempts_nataraj() -> None:
    # A wide granularity keeps the fair pool from switching by itself in this test.
    policy, clock = uniun(PolicyConfig(granularity_s=1000.0))
    runner = FakeRunner(policy, clock)
    policy.submit(spec("nataraj-1", "nataraj", max_new_tokens=1000))
    runner.decide()
    deadline = clock.t + 10.0  # the wall clock of this test is the fake clock
    assert policy.submit(spec("gana-cron", "gana", deadline=deadline)) == 4
    runner.decide()
    runner.run_for(9.8)
    assert runner.running == "nataraj-1"
    assert not any(isinstance(d, Preempt) for d in runner.decisions)
    # The host's single timer is armed for the promotion, so it happens on time.
    assert runner.decisions[-1].wake_at is not None
    assert runner.decisions[-1].wake_at <= deadline
    clock.t = deadline
    decision = runner.decide()
    assert decision == Preempt("nataraj-1", "gana-cron", "preempted", decision.wake_at)
    runner.step()
    run = runner.decisions[-1]
    assert isinstance(run, Run) and run.job_id == "gana-cron" and run.tier == 3


def test_scenario_4_opening_the_deck_hoists_nataraj_and_gana_resumes_on_leaving() -> None:
    config = PolicyConfig()
    policy, clock = uniun(config)
    runner = FakeRunner(policy, clock)
    policy.submit(spec("gana-1", "gana", max_new_tokens=300))
    runner.decide()
    runner.run_for(5.0)
    for i in (1, 2, 3):
        policy.submit(spec(f"nataraj-{i}", "nataraj", max_new_tokens=50))
    assert isinstance(runner.decide(), Idle)  # both T4: the running job keeps its turn
    policy.set_foreground("nataraj")  # the user opens the deck
    decision = runner.decide()
    assert decision == Preempt("gana-1", "nataraj-1", "preempted", decision.wake_at)
    runner.step()
    assert runner.running == "nataraj-1" and runner.decisions[-1].tier == 1
    assert policy.status()["queues"]["T4"] == ["gana-1"]  # re-queued, not dropped
    runner.run_for(10.5)  # two cards are made while the user looks at the deck
    assert runner.outcomes.get("nataraj-2") == "done" and runner.running == "nataraj-3"
    assert [seg.job_id for seg in runner.timeline].count("gana-1") == 1
    policy.set_foreground(None)  # the user leaves: Gana is owed runner time
    runner.run_for(config.slice_s + 0.2)
    resumed = [d for d in runner.decisions if isinstance(d, Run) and d.job_id == "gana-1"]
    assert len(resumed) == 2 and resumed[-1].resume
    runner.run_until_idle()
    assert runner.produced["gana-1"] == 300 and runner.outcomes["gana-1"] == "done"


def test_scenario_5_extract_backfill_is_held_to_its_budget() -> None:
    config = PolicyConfig()
    events: list = []
    for i in range(600):  # 500-note backfill style: one extract a second for 10 minutes
        events.append(Submit(float(i), spec(f"extract-{i}", "extract", max_new_tokens=80),
                             prompt_tokens=300, new_tokens=80))
    for i in range(40):  # plenty of fair-pool work from the start
        events.append(Submit(0.5 + i, spec(f"nataraj-{i}", "nataraj", max_new_tokens=400),
                             prompt_tokens=200, new_tokens=400))
        events.append(Submit(0.6 + i, spec(f"gana-{i}", "gana", max_new_tokens=400),
                             prompt_tokens=200, new_tokens=400))
    events.sort(key=lambda e: e.t)
    sim = Simulation("uniun", events, CostModel(), config=config, default_model=MODEL)
    # Ten minutes: fair-pool work is still queued then, so the budget is binding.
    result = sim.run(until=600.0)
    assert sim.policy.status()["queues"]["T4"]
    first_window = result.flow_runner_s
    total = sum(first_window.values())
    share_t2 = first_window["extract"] / total
    fair = (first_window["nataraj"] + first_window.get("gana", 0.0)) / total
    # T2 ramps to its cap and is held there; the fair pool gets the rest.
    assert 0.50 <= share_t2 <= config.t2_share_max + 0.03
    assert fair >= 1 - config.t2_share_max - 0.03
    assert first_window["gana"] > 0.3 * first_window["nataraj"]  # both T4 flows served


def test_scenario_6_affinity_prefers_the_loaded_model_until_the_chat_idle_gap_ends() -> None:
    config = PolicyConfig()
    policy, clock = uniun(config)
    runner = FakeRunner(policy, clock)
    policy.submit(spec("chat-1", "chat", max_new_tokens=10))
    runner.run_until_idle()
    chat_end = clock.t
    policy.submit(spec("gana-y", "gana", flow="gana:y", model_id="model-y", max_new_tokens=20))
    policy.submit(spec("gana-x", "gana", flow="gana:x", model_id=MODEL, max_new_tokens=20))
    run = runner.decide()
    assert isinstance(run, Run) and run.job_id == "gana-x" and not run.swap
    runner.run_for(2.0)
    assert runner.outcomes["gana-x"] == "done"
    idle = runner.decisions[-1]
    assert isinstance(idle, Idle) and idle.wake_at == chat_end + config.chat_idle_gap_s
    clock.t = idle.wake_at
    run = runner.decide()
    assert isinstance(run, Run) and run.job_id == "gana-y" and run.swap
    # A foreground signal makes the other-model Gana swap-worthy at once.
    policy2, clock2 = uniun(config)
    runner2 = FakeRunner(policy2, clock2)
    policy2.submit(spec("chat-1", "chat", max_new_tokens=10))
    runner2.run_until_idle()
    policy2.submit(spec("gana-y", "gana", model_id="model-y"))
    assert isinstance(runner2.decide(), Idle)
    policy2.set_foreground("gana")
    run = runner2.decide()
    assert isinstance(run, Run) and run.job_id == "gana-y" and run.swap and run.tier == 1


def test_scenario_7_opened_note_extract_is_t1_and_preempts_nataraj() -> None:
    policy, clock = uniun()
    runner = FakeRunner(policy, clock)
    policy.submit(spec("nataraj-1", "nataraj", max_new_tokens=200))
    runner.decide()
    runner.run_for(1.0)
    policy.set_foreground("extract")  # the user opens a note
    assert policy.submit(spec("backfill-1", "extract")) == 2  # no dodging the T2 budget
    assert isinstance(runner.decide(), Idle)  # T2 waits for the end of nataraj's slice
    assert policy.submit(spec("note-1", "extract", foreground_hint=True)) == 1
    decision = runner.decide()
    assert decision == Preempt("nataraj-1", "note-1", "preempted", decision.wake_at)
    runner.step()
    assert runner.running == "note-1" and runner.decisions[-1].tier == 1
    runner.run_until_idle()
    order = [seg.job_id for seg in runner.timeline]
    assert order == ["nataraj-1", "note-1", "backfill-1", "nataraj-1"]


def test_scenario_8_background_lifecycle_dispatches_nothing_idle_and_grants_25_percent() -> None:
    policy, clock = uniun()
    runner = FakeRunner(policy, clock)
    policy.set_lifecycle("background")
    assert runner.decide() == Idle(None)  # dormant: nothing queued, no timer
    clock.advance(60.0)
    assert runner.decide() == Idle(None)
    policy.submit(spec("nataraj-1", "nataraj", max_new_tokens=100))
    run = runner.decide()
    assert isinstance(run, Run) and run.token_grant == 25
    runner.run_for(3.0)
    assert runner.produced["nataraj-1"] == 25
    assert policy.status()["held"] == ["nataraj-1"]  # paused, snapshot kept, not dropped
    assert isinstance(runner.decide(), Idle)
    policy.submit(spec("chat-1", "chat", max_new_tokens=40))
    run = runner.decide()
    assert isinstance(run, Run) and run.job_id == "chat-1" and run.token_grant is None
    runner.run_for(5.0)
    assert runner.produced["chat-1"] == 40 and runner.running is None
    policy.set_lifecycle("foreground")
    run = runner.decide()
    assert isinstance(run, Run) and run.job_id == "nataraj-1" and run.resume
    assert run.token_grant is None
    runner.run_until_idle()
    assert runner.produced["nataraj-1"] == 100 and runner.outcomes["nataraj-1"] == "done"
    assert ReportOutcome.HELD.value == "held"
