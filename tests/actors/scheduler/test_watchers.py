"""Pushes to watching clients (pure, on a fake clock): the timeline at once, the status
when it changed and at most every interval, held while a chat waits for its first token,
other keys' job ids hidden."""

from __future__ import annotations

from tests.actors.policy.harness import FakeClock
from uniun.actors.scheduler.status import HIDDEN
from uniun.actors.scheduler.watchers import HOLD_MAX_S, Watchers
from uniun.actors.timeline import Mark, Segment

W, V = b"watcher-w", b"watcher-v"
MARK = Mark("preempt", 5.0, "bg-1", "preempted for chat-7")
SEGMENT = Segment("chat-7", "run", "chat", "chat", 0, "m", 1.0, 2.0, "done", 5)


def status(owner: str | None) -> dict:
    return {"owner": owner}


def owners(job_id: str) -> str | None:
    return {"bg-1": "alice", "chat-7": "bob"}.get(job_id)


def test_the_timeline_goes_out_at_once_and_the_status_at_most_every_interval() -> None:
    clock = FakeClock()
    watchers = Watchers(clock, every_s=0.25)
    watchers.add(W, None)
    first = watchers.sends([], 1, status, owners)
    assert [s.msg.get("status") for s in first] == [{"owner": None}]
    # A change 0.1 s later: its timeline goes out, its status waits for the interval.
    clock.advance(0.1)
    out = watchers.sends([MARK, SEGMENT], 2, status, owners)
    assert len(out) == 1 and out[0].msg["marks"][0]["job_id"] == "bg-1"
    assert out[0].msg["segments"][0]["job_id"] == "chat-7" and "status" not in out[0].msg
    assert watchers.due == clock() - 0.1 + 0.25
    clock.advance(0.15)
    assert [s.msg["status"] for s in watchers.sends([], 2, status, owners)] == [{"owner": None}]
    assert watchers.due is None
    assert watchers.sends([], 2, status, owners) == []  # nothing changed: nothing to push


def test_pushes_wait_for_a_chats_first_token_and_then_go_out_together() -> None:
    clock = FakeClock()
    watchers = Watchers(clock, every_s=0.25)
    watchers.add(W, None)
    watchers.sends([], 1, status, owners)
    clock.advance(1.0)
    # The chat arrives and preempts: nothing goes out while it has no first token...
    assert watchers.sends([MARK], 2, status, owners, hold=True) == []
    assert watchers.due == clock() + HOLD_MAX_S
    clock.advance(0.05)
    assert watchers.sends([SEGMENT], 3, status, owners, hold=True) == []
    # ...then its first token: the held records in order, and the status.
    out = watchers.sends([], 4, status, owners)
    assert [m["job_id"] for m in out[0].msg["marks"]] == ["bg-1"]
    assert [sg["job_id"] for sg in out[0].msg["segments"]] == ["chat-7"]
    assert out[1].msg["status"] == {"owner": None} and watchers.due is None


def test_a_long_prefill_holds_pushes_back_no_longer_than_the_cap() -> None:
    clock = FakeClock()
    watchers = Watchers(clock, every_s=0.25)
    watchers.add(W, None)
    assert watchers.sends([MARK], 1, status, owners, hold=True) == []
    clock.advance(HOLD_MAX_S)  # the host is woken at ``due``: still no first token
    out = watchers.sends([], 1, status, owners, hold=True)
    assert out[0].msg["marks"][0]["job_id"] == "bg-1" and out[1].msg["status"]
    assert len(watchers.sends([SEGMENT], 2, status, owners, hold=True)) == 1  # at once


def test_a_keyed_watcher_sees_other_keys_jobs_without_their_ids() -> None:
    watchers = Watchers(FakeClock())
    watchers.add(W, "alice")
    watchers.add(V, "bob")
    out = {s.conn: s.msg for s in watchers.sends([MARK, SEGMENT], 1, status, owners)
           if "marks" in s.msg}
    assert out[W]["marks"][0]["job_id"] == "bg-1"
    assert out[W]["marks"][0]["detail"] == "preempted"  # whom it made way for is cut
    assert out[W]["segments"][0]["job_id"] == HIDDEN
    assert out[V]["marks"][0]["job_id"] == HIDDEN and out[V]["segments"][0]["job_id"] == "chat-7"


def test_a_gone_watcher_is_forgotten() -> None:
    watchers = Watchers(FakeClock())
    watchers.add(W, None)
    watchers.drop(W)
    assert not watchers and watchers.sends([MARK], 1, status, owners) == []
