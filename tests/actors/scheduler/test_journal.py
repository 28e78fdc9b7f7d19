"""The job journal: what was acknowledged survives a reopen, with its streamed tokens."""

from __future__ import annotations

from pathlib import Path

from uniun.actors.scheduler.effects import (
    JAccept,
    JCancelAsked,
    JFinish,
    JPaused,
    JStarted,
    JToken,
)
from uniun.actors.scheduler.journal import Journal
from uniun.protocol.jobmap import validate_job

KINDS = ("chat", "extract", "nataraj", "gana")


def spec(job_id: str, **extra: object):
    return validate_job({"job_id": job_id, "kind": "extract", "prompt": "p", **extra},
                        default_model="tiny-1")


def replay(path: Path) -> dict:
    journal = Journal(path)
    try:
        entries = journal.replay(default_model="tiny-1", kinds=KINDS, max_new_tokens_cap=4096)
    finally:
        journal.close()
    return {e.spec.job_id: e for e in entries}


def test_an_accepted_job_and_its_tokens_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.write([JAccept(spec("a", max_new_tokens=9, deadline=5.0), at=100.0),
                   JStarted("a", seed=42, at=101.0)])
    for seq, (tid, text) in enumerate([(5, "he"), (6, "llo")]):
        journal.write([JToken("a", seq, tid, text, at=102.0 + seq)])
    journal.write([JToken("a", 1, 6, "llo", at=104.0),  # a replayed seq is harmless
                   JPaused("a", preemptions=1)])
    journal.close()  # no clean shutdown needed: every write is committed on return

    entry = replay(path)["a"]
    assert entry.spec == spec("a", max_new_tokens=9, deadline=5.0)
    assert (entry.accepted_at, entry.seed, entry.started, entry.preemptions) == (100.0, 42, True, 1)
    assert entry.token_ids == [5, 6] and entry.texts == ["he", "llo"]
    assert entry.first_token_at == 102.0 and entry.final is None


def test_a_finished_job_keeps_its_outcome_but_not_its_tokens(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.write([JAccept(spec("a"), at=1.0), JAccept(spec("b"), at=2.0),
                   JToken("a", 0, 5, "x", at=3.0)])
    journal.write([JFinish("a", {"type": "done", "job_id": "a", "text": "x"}, at=4.0)])
    journal.close()
    entries = replay(path)
    assert list(entries) == ["a", "b"]  # oldest first
    assert entries["a"].final == {"type": "done", "job_id": "a", "text": "x"}
    assert entries["a"].token_ids == [] and entries["b"].final is None


def test_prune_keeps_only_the_newest_finished_jobs(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.db", keep_done=2)
    for i in range(4):
        journal.write([JAccept(spec(f"j{i}"), at=float(i)),
                       JFinish(f"j{i}", {"type": "done"}, at=float(i))])
    journal.write([JAccept(spec("live"), at=9.0)])
    journal.prune()
    journal.close()
    assert list(replay(tmp_path / "journal.db")) == ["j2", "j3", "live"]


def test_a_batch_of_writes_is_all_or_nothing(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.write([JAccept(spec("a"), at=1.0)])
    unpackable = JFinish("a", {"type": "done", "bad": object()}, at=2.0)
    try:
        journal.write([JAccept(spec("b"), at=2.0), unpackable])
    except TypeError:
        pass
    else:
        raise AssertionError("a write that cannot be encoded must raise")
    journal.close()
    entries = replay(path)
    assert list(entries) == ["a"] and entries["a"].final is None  # "b" was rolled back


def test_an_acknowledged_cancel_survives_a_reopen_and_an_old_journal_gains_the_column(
        tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "journal.db"
    old = sqlite3.connect(str(path))  # the jobs table as journals before the column had it
    old.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, spec BLOB NOT NULL, "
                "accepted_at REAL NOT NULL, seed INTEGER, started INTEGER NOT NULL DEFAULT 0, "
                "preemptions INTEGER NOT NULL DEFAULT 0, first_token_at REAL, started_at REAL, "
                "final BLOB, finished_at REAL)")
    old.commit()
    old.close()
    journal = Journal(path)
    journal.write([JAccept(spec("a"), at=100.0), JAccept(spec("b"), at=101.0)])
    journal.write([JCancelAsked("a")])
    journal.close()
    entries = replay(path)
    assert entries["a"].cancel_asked is True and entries["b"].cancel_asked is False


def test_the_key_that_submitted_a_job_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal.write([JAccept(spec("keyed"), at=100.0, owner="alice-public-key"),
                   JAccept(spec("open"), at=101.0)])
    journal.close()
    entries = replay(path)
    assert entries["keyed"].owner == "alice-public-key" and entries["open"].owner is None
