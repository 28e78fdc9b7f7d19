"""The job journal: what was acknowledged survives a reopen, with its streamed tokens."""

from __future__ import annotations

from pathlib import Path

import msgpack

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


def test_an_unreadable_row_is_moved_to_the_dead_letters_and_the_others_come_back(
        tmp_path: Path) -> None:
    """Undecodable spec, outcome or token rows, and a spec naming another job, cost
    their own job only, named in the log: each row is moved, as it was, to the dead
    letters with its tokens, never deleted."""
    import sqlite3

    from loguru import logger

    path = tmp_path / "journal.db"
    journal = Journal(path)
    bad = ("bad-spec", "bad-final", "bad-token", "not-a-map", "other-id")
    journal.write([JAccept(spec(j), at=float(i)) for i, j in enumerate(("good", *bad))])
    journal.write([JToken("good", 0, 5, "he", at=9.0), JToken("bad-token", 0, 5, "x", at=9.0),
                   JToken("bad-token", 1, 6, "y", at=9.1),
                   JFinish("bad-final", {"type": "done", "job_id": "bad-final"}, at=9.5)])
    journal.close()
    other = msgpack.packb(spec("someone-else").to_map(), use_bin_type=True)
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE jobs SET spec = ? WHERE job_id = 'bad-spec'", (b"\xc1\xc1",))
        db.execute("UPDATE jobs SET final = ? WHERE job_id = 'bad-final'", (b"\x92\x01",))
        db.execute("UPDATE tokens SET text = ? WHERE job_id = 'bad-token' AND seq = 1",
                   (b"\xff",))
        db.execute("UPDATE jobs SET spec = ? WHERE job_id = 'not-a-map'", (b"\x93\x01\x02\x03",))
        db.execute("UPDATE jobs SET spec = ? WHERE job_id = 'other-id'", (other,))
    db.close()

    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(f"{m.record['extra'].get('job')} {m}"),
                      level="ERROR")
    try:
        entries = replay(path)
    finally:
        logger.remove(sink)
    assert list(entries) == ["good"]
    assert entries["good"].texts == ["he"]
    for job_id in bad:
        assert any(line.startswith(f"{job_id} ") and "moved to the dead letters" in line
                   for line in lines), lines
    assert list(replay(path)) == ["good"]  # moved for good: the next start is quiet
    db = sqlite3.connect(path)
    try:
        letters = {job_id: (spec_blob, reason) for job_id, spec_blob, reason in db.execute(
            "SELECT job_id, spec, reason FROM dead_letters")}
        assert sorted(letters) == sorted(bad)  # once each, not again at the second replay
        assert letters["bad-spec"][0] == b"\xc1\xc1"  # the raw bytes, as they were
        assert letters["not-a-map"][1] == "unreadable: TypeError: spec is a list, not a map"
        assert letters["other-id"][1] == \
            "unreadable: ValueError: spec names job 'someone-else'"
        assert db.execute("SELECT text FROM dead_tokens ORDER BY seq").fetchall() == \
            [("x",), (b"\xff",)]  # the tokens moved with their job
        assert db.execute("SELECT COUNT(*) FROM tokens WHERE job_id = 'bad-token'"
                          ).fetchone() == (0,)
        assert db.execute("SELECT final FROM dead_letters WHERE job_id = 'bad-final'"
                          ).fetchone() == (b"\x92\x01",)
    finally:
        db.close()


def test_what_a_client_was_told_is_flushed_and_tokens_ride_on_the_next_flush(
        tmp_path: Path) -> None:
    """Under "full" an accept, an acknowledged cancel and an end commit with SQLite's
    synchronous=FULL; token-only commits with NORMAL. Under "normal" nothing flushes."""
    import pytest

    def level(journal: Journal) -> str:
        return {1: "NORMAL", 2: "FULL"}[journal._db.execute("PRAGMA synchronous").fetchone()[0]]

    full = Journal(tmp_path / "full.db")
    normal = Journal(tmp_path / "normal.db", synchronous="normal")
    try:
        seen = []
        for write in ([JAccept(spec("a"), at=1.0)], [JToken("a", 0, 5, "x", at=2.0)],
                      [JToken("a", 1, 5, "y", at=2.0), JCancelAsked("a")],
                      [JStarted("a", seed=1, at=3.0)],
                      [JFinish("a", {"type": "done", "job_id": "a"}, at=4.0)]):
            full.write(write)
            normal.write(write)
            seen.append((level(full), level(normal)))
        assert seen == [("FULL", "NORMAL"), ("NORMAL", "NORMAL"), ("FULL", "NORMAL"),
                        ("NORMAL", "NORMAL"), ("FULL", "NORMAL")]
    finally:
        full.close()
        normal.close()
    with pytest.raises(ValueError, match="full, normal"):
        Journal(tmp_path / "off.db", synchronous="off")
