"""T0's fair shares between clients (chatshare.py), against the pure policy on a fake clock.

What a user would notice: another client's long chat (or its ``n`` choices) does not hold
their first token; two clients chatting at once alternate; one client's many requests do
not starve another; a chat paused for another client's resumes with every token; one
client's own chats keep their order. Assertions are on order and token counts, never on
time.
"""

from __future__ import annotations

import pytest

from tests.actors.policy.harness import FakeRunner, Segment, spec, uniun
from uniun.actors.policy import PolicyConfig, Preempt, ReportOutcome, Run

QUANTUM = PolicyConfig().chat_quantum_tokens


def chat(job_id: str, client: str, tokens: int) -> object:
    return spec(job_id, "chat", max_new_tokens=tokens, client=client)


def owner(job_id: str) -> str:
    return job_id.split("-")[0]


def merged(timeline: list[Segment]) -> list[tuple[str, int]]:
    """The runner's history as (client, segments in a row) turns."""
    turns: list[tuple[str, int]] = []
    for seg in timeline:
        who = owner(seg.job_id)
        if turns and turns[-1][0] == who:
            turns[-1] = (who, turns[-1][1] + 1)
        else:
            turns.append((who, 1))
    return turns


def test_another_clients_chat_runs_before_an_n4_long_chat_finishes() -> None:
    policy, clock = uniun()
    runner = FakeRunner(policy, clock)
    for i in range(4):  # OpenAI n: 4 -> four jobs of one client, one after another
        policy.submit(chat(f"a-{i}", "a", 256))
    runner.decide()
    for _ in range(40):
        runner.step()
    policy.submit(chat("b-0", "b", 4))
    decision = runner.decide()  # the scheduler asks on the chat's arrival
    assert isinstance(decision, Preempt)
    assert (decision.running_job_id, decision.for_job_id, decision.reason) == (
        "a-0", "b-0", "slice")
    runner.step()  # the next token: a-0 pauses, b-0 starts
    assert runner.timeline[-2].how == "paused:slice" and runner.running == "b-0"
    a_tokens_before_b = sum(runner.produced.get(f"a-{i}", 0) for i in range(4))
    runner.run_until_idle()
    assert a_tokens_before_b == 41  # a-0 had one more token: b took the next boundary
    order = [seg.job_id for seg in runner.timeline if seg.how == "done"]
    assert order.index("b-0") < order.index("a-0")
    assert all(runner.produced[f"a-{i}"] == 256 for i in range(4))
    assert all(runner.outcomes[f"a-{i}"] == "done" for i in range(4))
    resumes = [d.resume for d in runner.decisions if isinstance(d, Run) and d.job_id == "a-0"]
    assert resumes == [False, True]  # resumed from its snapshot, never restarted


def test_a_paused_chat_is_requeued_at_the_front_of_its_clients_chats() -> None:
    policy, clock = uniun()
    runner = FakeRunner(policy, clock)
    policy.submit(chat("a-0", "a", 100))
    policy.submit(chat("a-1", "a", 100))
    runner.decide()
    for _ in range(QUANTUM):
        runner.step()
    policy.submit(chat("b-0", "b", 200))
    runner.decide()
    clock.advance(0.1)
    policy.on_tokens("a-0", 1, 0.1)
    outcome = policy.on_paused("a-0", 0.0, "slice")
    assert outcome is ReportOutcome.REQUEUED
    assert policy.status()["queues"]["T0"][-2:] == ["a-0", "a-1"]  # a-0 before a-1


def test_two_clients_chatting_at_once_alternate() -> None:
    policy, clock = uniun()
    runner = FakeRunner(policy, clock)
    policy.submit(chat("a-0", "a", 300))
    policy.submit(chat("b-0", "b", 300))
    runner.run_until_idle()
    turns = merged(runner.timeline)
    assert len(turns) >= 300 * 2 // (QUANTUM + 1) - 2  # taking turns all along
    assert all(count == 1 for _, count in turns)  # never the same client twice in a row
    # At every switch the two have had about the same service: within a quantum.
    produced = {"a": 0, "b": 0}
    for seg in runner.timeline[:-2]:
        produced[owner(seg.job_id)] += round((seg.end - seg.start) / runner.step_s)
        assert abs(produced["a"] - produced["b"]) <= QUANTUM + 1
    assert runner.produced == {"a-0": 300, "b-0": 300}


def test_each_turn_lasts_at_least_the_quantum() -> None:
    config = PolicyConfig(chat_quantum_tokens=5)
    policy, clock = uniun(config)
    runner = FakeRunner(policy, clock)
    policy.submit(chat("a-0", "a", 60))
    policy.submit(chat("b-0", "b", 60))
    runner.run_until_idle()
    lengths = [round((s.end - s.start) / runner.step_s) for s in runner.timeline]
    # a-0 found the runner free: no turn to protect, b takes it at the next token; from
    # then on each turn is won by pausing the other and lasts the quantum
    assert lengths[0] <= 2
    assert all(n >= 5 for n in lengths[1:-1])
    assert len(lengths) >= 60 * 2 // (5 + 1) - 2  # each turn: the quantum, + 1 to stop


def test_one_clients_many_requests_do_not_starve_another() -> None:
    policy, clock = uniun()
    runner = FakeRunner(policy, clock)
    for i in range(20):
        policy.submit(chat(f"a-{i}", "a", 50))
    runner.decide()
    done_b = []
    for i in range(3):
        for _ in range(30):
            runner.step()
        policy.submit(chat(f"b-{i}", "b", 20))
        runner.decide()
    runner.run_until_idle()
    order = [seg.job_id for seg in runner.timeline if seg.how == "done"]
    done_b = [order.index(f"b-{i}") for i in range(3)]
    # Each b chat ends within a couple of a's jobs of its arrival, not after all 20.
    assert max(done_b) < order.index("a-5")
    assert sum(1 for job in order if job.startswith("a-")) == 20


def test_a_clients_own_chats_keep_first_come_order_and_never_preempt_each_other() -> None:
    policy, clock = uniun()
    runner = FakeRunner(policy, clock)
    for i in range(5):
        policy.submit(chat(f"a-{i}", "a", 30))
        runner.decide()
        runner.step()
    runner.run_until_idle()
    assert [s.job_id for s in runner.timeline] == [f"a-{i}" for i in range(5)]
    assert not any(isinstance(d, Preempt) for d in runner.decisions)


def test_chats_without_a_client_are_one_client_first_come_first_served() -> None:
    policy, clock = uniun()
    runner = FakeRunner(policy, clock)
    policy.submit(spec("c-1", "chat", max_new_tokens=100))
    runner.decide()
    runner.step()
    policy.submit(spec("c-2", "chat", max_new_tokens=5))
    runner.run_until_idle()
    assert [s.job_id for s in runner.timeline] == ["c-1", "c-2"]


def test_a_client_back_from_idle_is_lifted_and_cannot_bank_credit() -> None:
    policy, clock = uniun()
    runner = FakeRunner(policy, clock)
    policy.submit(chat("b-0", "b", 5))  # b is served a little, then leaves
    runner.run_until_idle()
    policy.submit(chat("a-0", "a", 1000))  # a alone for a long time
    runner.decide()
    for _ in range(500):
        runner.step()
    policy.submit(chat("b-1", "b", 1000))  # b is back with 495 tokens "owed" to it
    counters = policy.chat_counters()
    assert counters["b"] >= counters["a"] - 1  # lifted to the active clients' floor
    runner.run_until_idle()
    after = runner.timeline[1:]  # from a-0's first turn on
    lengths = [round((s.end - s.start) / runner.step_s) for s in after[1:-2]]
    assert max(lengths) <= QUANTUM + 1  # b never ran hundreds of tokens in one go


def test_the_prompt_counts_against_its_client() -> None:
    config = PolicyConfig(chat_prompt_weight=0.5)
    policy, clock = uniun(config)
    runner = FakeRunner(policy, clock, prompts={"a-0": 400})
    policy.submit(chat("a-0", "a", 40))
    policy.submit(chat("b-0", "b", 300))
    runner.run_until_idle()
    # a's 400-token prompt is worth 200 tokens: b runs that long before a's next turn.
    first_b = next(s for s in runner.timeline if s.job_id == "b-0")
    assert round((first_b.end - first_b.start) / runner.step_s) >= 200 - QUANTUM


def test_a_cancel_during_a_share_pause_ends_the_chat_cancelled() -> None:
    policy, clock = uniun()
    runner = FakeRunner(policy, clock)
    policy.submit(chat("a-0", "a", 100))
    runner.decide()
    for _ in range(QUANTUM + 1):
        runner.step()
    policy.submit(chat("b-0", "b", 10))
    assert isinstance(runner.decide(), Preempt)
    policy.cancel("a-0")
    clock.advance(0.1)
    assert policy.on_paused("a-0", 0.0, "slice") is ReportOutcome.CANCELLED


def test_a_chat_paused_for_another_reason_still_ends() -> None:
    policy, clock = uniun()
    runner = FakeRunner(policy, clock)
    policy.submit(chat("a-0", "a", 100))
    runner.decide()
    runner.step()
    # the host pauses it itself (the scheduler is stopping): the chat has ended
    assert policy.on_paused("a-0", 0.0, "preempted") is ReportOutcome.CHAT_INTERRUPTED


def test_status_counts_chatting_clients_without_naming_them() -> None:
    policy, _ = uniun()
    policy.submit(chat("a-0", "a", 10))
    policy.submit(chat("a-1", "a", 10))
    policy.submit(chat("b-0", "b", 10))
    status = policy.status()
    assert status["chat_clients"] == 2
    assert "a" not in str(status.get("chat_clients"))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_the_quantum_must_be_a_positive_integer(bad: object) -> None:
    with pytest.raises(ValueError, match="chat_quantum_tokens"):
        PolicyConfig(chat_quantum_tokens=bad)  # type: ignore[arg-type]


def test_a_third_client_waits_at_most_the_quantum_of_a_turn_just_won() -> None:
    policy, clock = uniun()
    runner = FakeRunner(policy, clock)
    policy.submit(chat("a-0", "a", 200))
    runner.decide()
    for _ in range(30):
        runner.step()
    policy.submit(chat("b-0", "b", 200))  # b pauses a: its turn is protected
    runner.decide()
    runner.step()
    runner.step()
    assert runner.running == "b-0"
    policy.submit(chat("c-0", "c", 5))
    runner.decide()
    while runner.running != "c-0":
        runner.step()
    assert runner.produced["b-0"] <= QUANTUM + 1  # c took the runner at b's turn's end
    assert runner.produced["b-0"] >= QUANTUM  # ...not before
