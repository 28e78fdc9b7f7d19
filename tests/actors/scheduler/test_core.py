"""The scheduler core's promises, one scenario each, without sockets or processes.

A :class:`SchedulerCore` on a fake clock is fed what its host would feed it (client
requests, runner reports, the runner coming and going) and the Effects it returns are
what a client or the runner would receive. The runner is the runner process's own job
bookkeeping (``actors/runner/jobs.py``) over a fake model (``driver.py``); the
end-to-end versions of these scenarios live in ``tests/integration/``.
"""

from __future__ import annotations

from tests.actors.runner.fake_session import texts
from tests.actors.scheduler.driver import (
    MODEL,
    Driver,
    commands,
    entry,
    msgs,
    text_of,
    token_id,
)
from uniun.actors.scheduler.effects import JCancelAsked, JFinish, JPaused
from uniun.protocol import messages as m, requests as rq, runner_records as rp

A, B, C = b"client-a", b"client-b", b"client-c"


def seqs(events: list[dict]) -> list[int]:
    return [e["seq"] for e in events if e["type"] == "token"]


def terminal(d: Driver, conn: bytes, job: str) -> list[dict]:
    return [e for e in d.told(conn, job) if e["type"] in ("done", "error") and "re" not in e]


def started_job(kind: str = "nataraj", job: str = "bg", tokens: int = 4,
                **fields: object) -> Driver:
    """A runner up, ``job`` submitted by client A and ``tokens`` tokens into its run."""
    d = Driver()
    d.up()
    d.submit(A, job, kind, **fields)
    d.deliver()
    d.step(tokens)
    return d


# ---- runner failure -------------------------------------------------------------------


def test_failover_requeues_a_non_chat_job_and_the_next_runner_continues_after_its_tokens() -> None:
    d = started_job("nataraj", "bg", 4, max_new_tokens=10)
    down = d.down("killed")
    assert msgs(down) == [] and down.journal == []  # no end: the job waits for a runner
    assert d.core.policy.status()["queues"]["T4"] == ["bg"]

    up = d.up(pid=2, model_id=None)
    load, start = up.commands
    assert load == rp.Load(model_id=MODEL)
    assert isinstance(start, rp.Start) and start.job_id == "bg"
    assert start.tokens == [token_id(s) for s in range(4)] and start.text == texts(4)
    assert start.seed == 7  # the effective seed the first runner reported

    d.run()
    events = d.told(A, "bg")
    assert [e["resumed"] for e in events if e["type"] == "started"] == [False, True]
    assert seqs(events) == list(range(10))  # every token exactly once
    [done] = terminal(d, A, "bg")
    assert done["type"] == "done" and done["text"] == texts(10)
    assert done["usage"]["completion_tokens"] == 10


def test_failover_ends_a_running_chat_with_a_retryable_runner_failed_and_never_reruns_it() -> None:
    d = started_job("chat", "talk", 3, max_new_tokens=10)
    down = d.down("killed")
    [end] = msgs(down, A, job="talk")
    assert end["type"] == "error" and end["code"] == "runner_failed"
    assert end["retryable"] is True
    assert [w.job_id for w in down.journal if isinstance(w, JFinish)] == ["talk"]

    up = d.up(pid=2)
    assert commands(up) == []  # nothing to run: the chat is not silently re-run
    assert d.run().sends == []
    assert terminal(d, A, "talk") == [end]


# ---- attach ---------------------------------------------------------------------------


def test_attach_after_a_reconnect_replays_the_missed_tokens_then_streams_live() -> None:
    d = started_job("extract", "x", 5, max_new_tokens=8)
    d.gone(A)
    attached = d.attach(B, "x", after_seq=2)
    reply, *missed = msgs(attached, B)
    assert reply["type"] == "accepted" and reply["re"] == "a-x"
    assert reply["state"] == "running" and reply["streamed"] == 5
    assert seqs(missed) == [3, 4] and [e["text"] for e in missed] == [text_of(3), text_of(4)]

    live = d.run()
    assert seqs(msgs(live, B)) == [5, 6, 7]
    [done] = msgs(live, B, "done")
    assert done["text"] == texts(8)
    assert msgs(live, A) == []  # the gone connection is told nothing more


def test_attach_to_an_ended_job_gets_its_terminal_event_and_an_unknown_job_is_not_found() -> None:
    d = started_job("extract", "x", 0, max_new_tokens=3)
    d.run()
    [done] = terminal(d, A, "x")
    reply, last, again = msgs(d.attach(C, "x", after_seq=1), C)
    assert reply["type"] == "accepted" and reply["state"] == "ended"
    assert seqs([last]) == [2] and again == done

    [missing] = msgs(d.attach(C, "nope"), C)
    assert missing["type"] == "error" and missing["code"] == "not_found"
    assert missing["re"] == "a-nope"


# ---- idempotent submit ----------------------------------------------------------------


def test_a_resubmit_of_the_same_job_is_acknowledged_again_and_runs_once() -> None:
    d = started_job("extract", "i", 2, max_new_tokens=4)
    again = d.submit(A, "i", "extract", max_new_tokens=4)
    [reply] = msgs(again)
    assert reply["type"] == "accepted" and reply["state"] == "running"
    assert reply["streamed"] == 2
    assert again.journal == [] and again.commands == []

    d.run()
    after = d.submit(B, "i", "extract", max_new_tokens=4)
    reply, outcome = msgs(after, B)
    assert reply["state"] == "ended" and outcome == terminal(d, A, "i")[0]
    assert outcome["type"] == "done"
    assert sum(isinstance(c, rp.Start) and c.job_id == "i" for c in d.runner.received) == 1
    assert len(terminal(d, A, "i")) == 1 and seqs(d.told(A, "i")) == [0, 1, 2, 3]


def test_a_resubmit_from_a_new_connection_replays_the_tokens_streamed_so_far() -> None:
    # A client whose submit reply was lost with a killed scheduler re-sends the submit on
    # a fresh socket: it has none of the job's tokens, so they come again, then the rest.
    d = started_job("extract", "i", 3, max_new_tokens=5)
    again = d.submit(B, "i", "extract", max_new_tokens=5)
    reply, *replayed = msgs(again, B)
    assert reply["type"] == "accepted" and reply["streamed"] == 3
    assert seqs(replayed) == [0, 1, 2] and "".join(e["text"] for e in replayed) == texts(3)
    assert msgs(d.submit(B, "i", "extract", max_new_tokens=5), B, "token") == []  # has them
    d.run()
    assert seqs(d.told(B, "i")) == [0, 1, 2, 3, 4] and len(terminal(d, B, "i")) == 1


def test_a_different_job_under_an_accepted_id_is_invalid_field_job_id_and_changes_nothing() -> None:
    d = started_job("extract", "i", 2, max_new_tokens=4)
    other = d.submit(B, "i", "extract", max_new_tokens=5)
    [err] = msgs(other, B)
    assert err["type"] == "error" and err["code"] == "invalid_field"
    assert err["field"] == "job_id" and err["job_id"] == "i"
    assert other.journal == [] and other.commands == []
    d.run()
    [done] = terminal(d, A, "i")  # the accepted job runs on as it was
    assert done["usage"]["completion_tokens"] == 4 and terminal(d, B, "i") == []


# ---- cancel ---------------------------------------------------------------------------


def test_cancel_of_a_queued_job_ends_it_at_once_and_it_never_runs() -> None:
    d = started_job("nataraj", "first", 2)
    d.submit(A, "queued", "nataraj")
    fx = d.cancel(B, "queued")
    assert msgs(fx, B) == [m.reply_cancelled("c-queued", "queued")]
    [end] = msgs(fx, A, job="queued")
    assert end["type"] == "error" and end["code"] == "cancelled"
    assert commands(fx) == []  # it never reached the runner: nothing to drop
    assert "queued" not in str(d.core.policy.status()["queues"])

    assert msgs(d.cancel(B, "queued"), B) == [m.reply_cancelled("c-queued", "queued")]
    d.cancel(A, "first")
    d.run()
    assert terminal(d, A, "queued") == [end]
    assert not any(isinstance(c, (rp.Start, rp.Resume)) and c.job_id == "queued"
                   for c in d.runner.received)


def test_cancel_of_a_running_job_stops_it_on_the_runner_and_ends_it_once() -> None:
    d = started_job("nataraj", "run", 2)
    d.submit(A, "next", "nataraj", max_new_tokens=2)
    fx = d.cancel(B, "run")
    assert msgs(fx, B) == [m.reply_cancelled("c-run", "run")]
    assert commands(fx) == [rp.Cancel(job_id="run")] and msgs(fx, A) == []
    twice = d.cancel(B, "run")  # acknowledged again, not sent to the runner again
    assert msgs(twice, B) == [m.reply_cancelled("c-run", "run")] and commands(twice) == []

    stopped = d.deliver()
    [end] = msgs(stopped, A, job="run")
    assert end["type"] == "error" and end["code"] == "cancelled"
    assert [c.job_id for c in commands(stopped, rp.Start)] == ["next"]  # the runner moves on
    d.run()
    assert terminal(d, A, "run") == [end]
    assert terminal(d, A, "next")[0]["type"] == "done"


def test_a_finish_that_races_an_acknowledged_cancel_ends_the_job_cancelled_exactly_once() -> None:
    d = started_job("nataraj", "race", 3, max_new_tokens=5)
    assert commands(d.cancel(A, "race")) == [rp.Cancel(job_id="race")]
    raced = d.step(2)  # the runner finishes before it reads the Cancel
    assert msgs(raced, A, "token") == []  # nothing more is streamed after the cancel
    [end] = terminal(d, A, "race")
    assert end["type"] == "error" and end["code"] == "cancelled"
    assert d.deliver().sends == []  # the Cancel reaches a runner that is done with it

    late = d.report(rp.Cancelled(job_id="race", seconds=0.0))
    assert late.journal == [] and late.sends == [] and late.commands == []
    assert terminal(d, A, "race") == [end]


# ---- admission and preemption ---------------------------------------------------------


def status(d: Driver) -> dict:
    [reply] = msgs(d.request(C, rq.StatusRequest("st")), C)
    return reply


def test_a_submit_beyond_queue_cap_is_queue_full_and_changes_nothing() -> None:
    d = Driver(queue_cap=2, chat_reserve_share=0.0, client_share=1.0)  # the cap alone
    d.up()
    d.submit(A, "one")
    d.submit(A, "two")
    before = status(d)
    full = d.submit(A, "three")
    [err] = msgs(full, A)
    assert err["type"] == "error" and err["code"] == "queue_full"
    assert err["retryable"] is True and err["job_id"] == "three"
    assert full.journal == [] and full.commands == []
    assert status(d) == before and before["jobs"] == 2
    assert msgs(d.attach(A, "three"), A)[0]["code"] == "not_found"


def test_a_chat_preempts_a_running_nataraj_job_which_later_resumes_where_it_paused() -> None:
    d = started_job("nataraj", "n", 4, max_new_tokens=10)
    arrival = d.submit(B, "chat", "chat", max_new_tokens=3)
    assert commands(arrival) == [rp.Pause(job_id="n")]

    parked = d.deliver()
    assert msgs(parked, A, "paused", "n") == [m.event_paused("n", "preempted")]
    assert JPaused("n", preemptions=1) in parked.journal
    assert [c.job_id for c in commands(parked, rp.Start)] == ["chat"]

    d.run()
    assert terminal(d, B, "chat")[0]["type"] == "done"
    dispatches = [c for c in d.runner.received
                  if isinstance(c, (rp.Start, rp.Resume)) and c.job_id == "n"]
    assert type(dispatches[0]) is rp.Start
    assert dispatches[1:] == [rp.Resume(job_id="n", generated=4, grant=0)]
    assert seqs(d.told(A, "n")) == list(range(10))
    [done] = terminal(d, A, "n")
    assert done["text"] == texts(10) and done["preemptions"] == 1


# ---- restart: journal replay and a runner that holds jobs -----------------------------


def test_replay_ends_a_started_chat_retryable_and_resumes_a_non_chat_after_its_tokens() -> None:
    d = Driver(entries=[entry("chat", "chat", 2), entry("bg", "nataraj", 3, max_new_tokens=6)])
    [finish] = d.history[0].journal
    assert isinstance(finish, JFinish) and finish.job_id == "chat"
    assert finish.final["code"] == "runner_failed" and finish.final["retryable"] is True

    up = d.up()
    [start] = commands(up)
    assert isinstance(start, rp.Start) and start.job_id == "bg" and start.seed == 9
    assert start.tokens == [token_id(s) for s in range(3)] and start.text == texts(3)

    reply, end = msgs(d.attach(A, "chat", after_seq=1), A)
    assert reply["state"] == "ended" and end == finish.final
    missed = msgs(d.attach(A, "bg", after_seq=0), A)
    assert seqs(missed) == [1, 2]
    d.run()
    assert seqs(d.told(A, "bg")) == [1, 2, 3, 4, 5]
    assert terminal(d, A, "bg")[0]["text"] == texts(6)


def test_runner_up_drops_jobs_the_core_does_not_know_and_resumes_one_it_holds_exactly() -> None:
    d = Driver(entries=[entry("kept", "nataraj", 3, max_new_tokens=6)])
    d.attach(A, "kept", after_seq=2)
    up = d.spilled("kept", 3, max_new_tokens=6).spilled("stray", 5).up()
    assert commands(up) == [rp.Drop(job_id="stray"), rp.Resume(job_id="kept", generated=3)]
    d.run()
    assert not d.runner.holds("stray")
    [started] = [e for e in d.told(A, "kept") if e["type"] == "started"]
    assert started["resumed"] is True
    assert terminal(d, A, "kept")[0]["text"] == texts(6)


def test_runner_up_holding_a_job_at_another_count_gets_a_full_start() -> None:
    d = Driver(entries=[entry("kept", "nataraj", 3, max_new_tokens=6)])
    [start] = commands(d.spilled("kept", 5).up())
    assert isinstance(start, rp.Start) and start.tokens == [token_id(s) for s in range(3)]


def test_a_job_the_new_runner_holds_at_another_count_is_dropped_there_when_cancelled() -> None:
    d = Driver(entries=[entry("busy", "nataraj", 0, max_new_tokens=50),
                        entry("kept", "nataraj", 3, max_new_tokens=6)])
    d.spilled("kept", 5).up()  # "busy" runs first; "kept" waits
    assert commands(d.cancel(A, "kept")) == [rp.Drop(job_id="kept")]


def test_a_resume_the_runner_cannot_honour_becomes_a_start_and_the_runner_holds_the_job() -> None:
    d = started_job("nataraj", "n", 2, max_new_tokens=10)
    d.submit(B, "chat1", "chat", max_new_tokens=1)
    d.deliver()
    d.runner.lot.discard("n")  # the runner lost its record of the parked job
    d.step()  # chat1 ends
    d.deliver()  # Resume of n -> Unknown -> Start with the streamed tokens
    d.step()
    dispatches = [c for c in d.runner.received
                  if isinstance(c, (rp.Start, rp.Resume)) and c.job_id == "n"]
    assert [type(c) for c in dispatches] == [rp.Start, rp.Resume, rp.Start]
    assert dispatches[2].tokens == [token_id(0), token_id(1)]
    # Parked again, then cancelled while it waits: the runner must forget it too.
    d.submit(B, "chat2", "chat", max_new_tokens=50)
    d.deliver()
    assert d.runner.active == "chat2" and d.runner.holds("n")
    assert commands(d.cancel(A, "n")) == [rp.Drop(job_id="n")]
    d.deliver()
    assert not d.runner.holds("n")


# ---- poison ---------------------------------------------------------------------------


def test_a_job_running_at_three_runner_deaths_in_a_row_is_dead_lettered_as_poisoned() -> None:
    d = started_job("nataraj", "bad", 4, max_new_tokens=10)
    d.down("killed")  # 1: it was running, 4 tokens streamed
    for pid in (2, 3):  # each new runner is told to run it and dies before a token
        assert isinstance(commands(d.up(pid=pid))[-1], rp.Start)
        d.deliver()  # Started, and it dies before a token
        down = d.down("killed")
    [end] = terminal(d, A, "bad")
    assert end["type"] == "error" and end["code"] == "poisoned" and end["retryable"] is False
    assert [w.job_id for w in down.journal if isinstance(w, JFinish)] == ["bad"]
    up = d.up(pid=4)
    assert not any(isinstance(c, rp.Start) for c in commands(up))  # not run again
    assert [p["job_id"] for p in _status(d)["poisoned"]] == ["bad"]


def test_runner_deaths_with_tokens_in_between_are_not_poison() -> None:
    d = started_job("nataraj", "ok", 2, max_new_tokens=40)
    for pid in (2, 3, 4):
        d.down("killed")
        d.up(pid=pid)
        d.deliver()
        d.step(2)  # the job makes progress on every new runner
    d.down("killed")
    d.up(pid=5)
    d.run()
    [done] = terminal(d, A, "ok")
    assert done["type"] == "done" and done["text"] == texts(40)
    assert _status(d)["poisoned"] == []


def _status(d: Driver) -> dict:
    fx = d.request(B, rq.StatusRequest("st"))
    [reply] = msgs(fx, B, "status")
    return reply


def test_a_cancel_acknowledged_before_a_scheduler_restart_ends_the_job_cancelled() -> None:
    # The cancel reply went out, then the scheduler died before the runner stopped the job:
    # the journal holds the cancel, so the replayed job ends cancelled and never runs on.
    d = started_job("nataraj", "asked", 2, max_new_tokens=8)
    fx = d.cancel(B, "asked")
    assert JCancelAsked("asked") in fx.journal  # committed before the reply is sent
    e = entry("asked", "nataraj", 2, max_new_tokens=8)
    e.cancel_asked = True
    again = Driver(entries=[e])
    [finish] = again.history[0].journal
    assert isinstance(finish, JFinish) and finish.final["code"] == "cancelled"
    up = again.spilled("asked", 2).up()
    assert commands(up) == [rp.Drop(job_id="asked")]
    told = msgs(again.attach(A, "asked"), A)
    assert told[0]["state"] == "ended" and told[-1] == finish.final
    assert not any(t["type"] == "done" for t in told)
