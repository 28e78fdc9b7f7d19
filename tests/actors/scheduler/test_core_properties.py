"""Promises of the scheduler core that must hold over a whole run, not one step:

- persist before telling: no ``accepted``, ``token`` or terminal event reaches a client
  before the journal holds it (the host commits each Effects' journal writes first);
- every accepted job ends exactly once, and every client that hears of its end hears
  the same end; the submitter's token stream is gap-free and never repeats a token;
- a chat is dispatched at most once (never silently re-run);
- nothing the core does is a bug it had to swallow (no ERROR log, no ``internal`` reply).

Checked over a scripted run that visits every path of the scenario tests, and over
random runs (submits, cancels, attaches, decode steps, runner deaths) drawn by Hypothesis.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loguru import logger

from tests.actors.scheduler.driver import (
    TOO_LONG,
    Driver,
    assert_persisted_before_told,
    entry,
    text_of,
)
from uniun.actors.policy import PolicyConfig
from uniun.actors.scheduler.effects import JFinish
from uniun.protocol import requests as rq
from uniun.protocol import runner_records as rp

A, B = b"client-a", b"client-b"
KINDS = ("chat", "extract", "nataraj", "gana")
# Short slices and gaps, so that short runs cross slice pauses and affinity waits.
CONFIG = PolicyConfig(slice_s=0.03, granularity_s=0.03, chat_idle_gap_s=0.2,
                      starvation_s=0.5)


@pytest.fixture
def errors() -> Iterator[list[str]]:
    """ERROR-level log lines of the core: each one is a bug it caught and swallowed."""
    lines: list[str] = []
    sink = logger.add(lambda msg: lines.append(str(msg)), level="ERROR")
    yield lines
    logger.remove(sink)


def finish(d: Driver) -> None:
    """Let the runner (a fresh one if it is dead) work until every job has ended."""
    if d.runner is None:
        d.up(pid=99)
    for _ in range(200):
        d.run()
        if not d.core.jobs.live:
            return
        d.wake()
    raise AssertionError(f"jobs never ended: {sorted(d.core.jobs.live)}")


def check_run(d: Driver, errors: list[str]) -> None:
    assert_persisted_before_told(d.history, d.replayed)
    assert errors == []
    finals: dict[str, list[dict]] = {}
    for fx in d.history:
        for w in fx.journal:
            if isinstance(w, JFinish):
                finals.setdefault(w.job_id, []).append(w.final)
    replayed_ended = {e.spec.job_id for e in d.replayed if e.final is not None}
    accepted = {s.msg["job_id"] for fx in d.history for s in fx.sends
                if s.msg["type"] == "accepted"}
    for job in accepted - replayed_ended:
        assert len(finals.get(job, [])) == 1, f"{job} ended {finals.get(job)}"
    dispatches: dict[str, int] = {}
    for fx in d.history:
        for s in fx.sends:
            msg = s.msg
            assert msg.get("code") != "internal", msg
            if msg["type"] in ("done", "error") and "re" not in msg:
                assert [msg] == finals[msg["job_id"]], "two different ends told"
        for c in fx.commands:
            if isinstance(c, (rp.Start, rp.Resume)):
                dispatches[c.job_id] = dispatches.get(c.job_id, 0) + 1
    for job, (final,) in finals.items():
        told = [m for fx in d.history for m in (s.msg for s in fx.sends if s.conn == A)
                if m.get("job_id") == job and m["type"] == "token"]
        assert [t["seq"] for t in told] == list(range(len(told))), f"{job}: gap or repeat"
        assert [t["text"] for t in told] == [text_of(t["seq"]) for t in told]
        if final["type"] == "done" and told:
            assert "".join(t["text"] for t in told) == final["text"]
    chats = {e.spec.job_id for e in d.replayed if e.spec.kind == "chat"}
    chats |= {s.msg["job_id"] for fx in d.history for s in fx.sends
              if s.msg["type"] == "started" and s.msg["tier"] == 0}
    assert all(dispatches.get(job, 0) <= 1 for job in chats), dispatches


def test_a_scripted_run_through_every_path_persists_before_telling(errors: list[str]) -> None:
    d = Driver(config=CONFIG, entries=[entry("old-chat", "chat", 2),
                                       entry("old-bg", "nataraj", 3, max_new_tokens=8)])
    d.spilled("old-bg", 3, max_new_tokens=8).spilled("stray", 1).up()
    d.attach(B, "old-chat")
    d.attach(B, "old-bg", after_seq=1)
    d.deliver()
    d.step(2)
    d.submit(A, "bg", "nataraj", max_new_tokens=12)
    d.submit(A, "gana", "gana", max_new_tokens=6)
    d.submit(A, "ex", "extract", max_new_tokens=5)
    d.submit(A, "ex", "extract", max_new_tokens=5)       # idempotent
    d.submit(A, "ex", "extract", max_new_tokens=6)       # refused: another job, same id
    d.run(6)
    d.submit(A, "chat", "chat", max_new_tokens=4)        # preempts whatever runs
    d.run(3)
    d.cancel(B, "gana")
    d.attach(B, "bg", after_seq=-1)
    d.down("killed")                                     # fails over; kills the chat
    d.up(pid=2, model_id=None)
    d.submit(A, "doomed", "gana", max_new_tokens=3,      # the runner cannot run it
             prompt=TOO_LONG)
    d.run(4)
    running = d.core.policy.running
    assert running is not None
    d.submit(A, "chat2", "chat", max_new_tokens=2)       # asks the running job to pause
    d.cancel(B, running.job_id)                          # and cancels it before it does
    d.deliver()
    d.submit(A, "race", "nataraj", max_new_tokens=20, stream=False)
    finish(d)
    d.cancel(A, "race")
    d.report(rp.Cancelled(job_id="race", seconds=0.0))   # late report: changes nothing
    d.submit(A, "bg", "nataraj", max_new_tokens=12)      # re-acknowledged after its end
    check_run(d, errors)
    told = {s.msg["type"] for fx in d.history for s in fx.sends}
    assert {"accepted", "started", "token", "paused", "done", "error", "cancelled"} <= told


ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("submit"), st.integers(0, 5), st.sampled_from(KINDS),
              st.integers(1, 12), st.sampled_from(("a", "b")), st.booleans(),
              st.booleans()),
    st.tuples(st.just("cancel"), st.integers(0, 5)),
    st.tuples(st.just("attach"), st.integers(0, 5), st.integers(-1, 6)),
    st.tuples(st.just("step"), st.integers(1, 4)),
    st.tuples(st.just("deliver"),),
    st.tuples(st.just("kill"), st.booleans()),
    st.tuples(st.just("foreground"), st.sampled_from((None,) + KINDS)),
), min_size=8, max_size=40)


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ACTIONS)
def test_random_runs_keep_every_promise(errors: list[str], actions: list[tuple]) -> None:
    errors.clear()
    check_run(play(actions), errors)


def play(actions: list[tuple]) -> Driver:
    """One random run: the actions in order, then every job left runs to its end."""
    d = Driver(config=CONFIG, queue_cap=5)
    d.up()
    for op, *args in actions:
        if op == "submit":
            n, kind, tokens, flow, other_model, stream = args
            d.submit(A, f"j{n}", kind, max_new_tokens=tokens, flow=flow, stream=stream,
                     model_id="m-other" if other_model else "m-chat")
        elif op == "cancel":
            d.cancel(A, f"j{args[0]}")
        elif op == "attach":
            d.attach(B, f"j{args[0]}", after_seq=args[1])
        elif op == "foreground":
            d.request(B, rq.Foreground("fg", args[0]))
        elif op == "kill" and d.runner is not None:
            # With args[0], its parked snapshots were spilled and the next runner has them.
            d.down("killed", spill=args[0])
        elif d.runner is None:  # the supervisor brings a new runner up
            d.up(pid=len(d.history), model_id=None)
        elif op == "step":
            d.step(args[0])
        elif op == "deliver":
            d.deliver()
    finish(d)
    return d
