"""Acknowledged means kept: a journal replay under another configuration never deletes
an accepted job. Real SQLite files, the real Journal, the real scheduler core."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.actors.policy.harness import MODEL, FakeClock
from tests.actors.scheduler.driver import Driver, commands, msgs
from uniun.actors.policy import make_policy
from uniun.actors.scheduler.core import SchedulerCore
from uniun.actors.scheduler.dead_letters import DeadLetters
from uniun.actors.scheduler.effects import JAccept, JFinish, JToken
from uniun.actors.scheduler.journal import Journal, JournalEntry
from uniun.actors.scheduler.status import HIDDEN
from uniun.protocol import requests as rq, runner_records as rp
from uniun.protocol.jobmap import JobSpec, validate_job

KINDS = ("chat", "extract", "nataraj", "gana")
WITHOUT_GANA = ("chat", "extract", "nataraj")
A = b"client-a"


def accepted(job_id: str, kind: str = "extract", **extra: object) -> JobSpec:
    """A job as the front accepted it under raised limits."""
    return validate_job({"job_id": job_id, "kind": kind, "prompt": "p", **extra},
                        default_model=MODEL, kinds=KINDS, max_new_tokens_cap=8192,
                        max_prompt_chars=300_000)


def replay(path: Path, kinds: tuple[str, ...] = KINDS) -> tuple[list[JournalEntry], DeadLetters]:
    """A restart's replay under today's defaults (max_prompt_chars 200,000, cap 4096)."""
    journal = Journal(path)
    try:
        entries = journal.replay(default_model=MODEL, kinds=kinds, max_new_tokens_cap=4096)
        return entries, journal.dead_letters()
    finally:
        journal.close()


def core_with(dead: DeadLetters) -> SchedulerCore:
    clock = FakeClock()
    return SchedulerCore(policy=make_policy("uniun", None, clock, wall_clock=clock),
                         queue_cap=100, clock=clock, wall=clock, segments=False,
                         metrics=False, dead_letters=dead)


def reply(core: SchedulerCore, request: rq.Request, owner: str | None = None) -> dict:
    (send,) = core.request(A, request, owner).sends
    return send.msg


def test_a_job_accepted_under_raised_limits_survives_a_replay_under_the_defaults(
        tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    big = accepted("big", prompt="x" * 250_000, max_new_tokens=6000)
    journal = Journal(path)
    journal.write([JAccept(big, at=100.0)])
    journal.close()

    entries, dead = replay(path)
    assert [e.spec for e in entries] == [big] and dead.count == 0
    d = Driver(entries=entries)  # the scheduler queues it and a runner is given it
    assert d.core.policy.status()["queues"]["T2"] == ["big"]
    [start] = commands(d.up(), rp.Start)
    assert (start.job_id, len(start.prompt or ""), start.max_new_tokens) == \
        ("big", 250_000, 6000)


def test_a_job_whose_kind_was_removed_is_moved_to_the_dead_letters_with_its_tokens(
        tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.write([JAccept(accepted("g1", "gana"), at=1.0), JAccept(accepted("e1"), at=2.0),
                   JAccept(accepted("g-done", "gana"), at=3.0),
                   JToken("g1", 0, 5, "he", at=4.0),
                   JFinish("g-done", {"type": "done", "job_id": "g-done"}, at=5.0)])
    journal.close()
    with sqlite3.connect(path) as db:
        (blob,) = db.execute("SELECT spec FROM jobs WHERE job_id = 'g1'").fetchone()

    entries, dead = replay(path, WITHOUT_GANA)
    # the ended gana job keeps its outcome: it never runs again, its kind does not matter
    assert [e.spec.job_id for e in entries] == ["e1", "g-done"]
    reason = "kind 'gana' is not in [jobs] kinds any more"
    shown = dead.status()
    assert shown is not None and shown["count"] == 1
    [letter] = shown["recent"]
    assert (letter["job_id"], letter["kind"], letter["reason"]) == ("g1", "gana", reason)
    assert isinstance(letter["at"], float)
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT job_id, spec, accepted_at, kind, reason FROM dead_letters"
                          ).fetchall() == [("g1", blob, 1.0, "gana", reason)]
        assert db.execute("SELECT seq, token_id, text FROM dead_tokens").fetchall() == \
            [(0, 5, "he")]
        assert db.execute("SELECT COUNT(*) FROM jobs WHERE job_id = 'g1'").fetchone() == (0,)
    finally:
        db.close()
    assert replay(path, KINDS)[1].count == 1  # kept, not moved again nor lost


def test_status_lists_the_dead_letters_and_attach_names_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.write([JAccept(accepted("g1", "gana"), at=1.0),
                   JAccept(accepted("g2", "gana"), at=2.0, owner="alice-key")])
    journal.close()
    core = core_with(replay(path, WITHOUT_GANA)[1])

    body = reply(core, rq.StatusRequest("st"))
    assert body["dead_letters"]["count"] == 2
    assert sorted(d["job_id"] for d in body["dead_letters"]["recent"]) == ["g1", "g2"]
    keyed = reply(core, rq.StatusRequest("st-k"), owner="bob-key")  # another key's ids hidden
    assert [d["job_id"] for d in keyed["dead_letters"]["recent"]] == [HIDDEN, HIDDEN]

    error = reply(core, rq.Attach("a1", "g1", -1))
    assert (error["type"], error["code"], error["retryable"], error["job_id"]) == \
        ("error", "not_found", False, "g1")
    assert "dead letters" in error["message"] and "kind 'gana' is not in [jobs] kinds" \
        in error["message"]
    assert "dead letters" not in reply(core, rq.Attach("a2", "g2", -1))["message"]
    assert "dead letters" in reply(core, rq.Attach("a3", "g2", -1), owner="alice-key")["message"]
    assert reply(core, rq.Attach("a4", "nothing", -1))["message"] == "no job 'nothing'"


def test_status_has_no_dead_letters_while_there_are_none(tmp_path: Path) -> None:
    assert "dead_letters" not in reply(core_with(replay(tmp_path / "j.db")[1]),
                                       rq.StatusRequest("st"))


def test_a_job_submitted_again_under_a_dead_lettered_id_is_a_new_job(tmp_path: Path) -> None:
    """The client's retry after the attach error: accepted, and attach finds it."""
    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.write([JAccept(accepted("g1", "gana"), at=1.0)])
    journal.close()
    core = core_with(replay(path, WITHOUT_GANA)[1])
    again = validate_job({"job_id": "g1", "kind": "extract", "prompt": "p"},
                         default_model=MODEL)
    assert reply(core, rq.Submit("s1", again))["type"] == "accepted"
    assert msgs(core.request(A, rq.Attach("a1", "g1", -1)), A)[0]["type"] == "accepted"


def test_the_status_command_prints_the_dead_letters() -> None:
    from rich.console import Console

    from uniun.runtime.commands.status import render

    reason = "kind 'gana' is not in [jobs] kinds any more"
    status = {"ready": True, "dead_letters": {"count": 3, "recent": [
        {"job_id": "g1", "kind": "gana", "reason": reason, "at": 1.0}]}}
    console = Console(width=200, record=True)
    console.print(render(status, "ipc:///x"))
    text = console.export_text()
    assert "3 kept in journal.db (table dead_letters)" in text
    assert f"g1 (gana): {reason}" in text  # "[jobs]" printed, not taken for markup
