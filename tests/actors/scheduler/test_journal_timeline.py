"""The journal's timeline tables: segments and marks written with the job writes, read
back by ``read_timeline`` (a separate read-only connection), pruned to the newest rows."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from uniun.actors.scheduler.effects import JMark, JSegment
from uniun.actors.scheduler.journal import Journal, read_timeline


def seg(job: str, start: float, end: float, reason: str = "done", lane: str = "run") -> JSegment:
    return JSegment(job, lane, "nataraj", "nataraj", 4, "m", start, end, reason, 3)


def test_segments_and_marks_round_trip_and_since_filters(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.db")
    journal.write([seg("a", 10.0, 11.0, "preempted"), JMark("preempt", 10.9, "a", "for c"),
                   seg("c", 11.0, 12.0), seg("a", 12.0, 15.0)])
    got, marks = read_timeline(tmp_path / "journal.db")
    assert [(s.job_id, s.reason) for s in got] == [("a", "preempted"), ("c", "done"),
                                                   ("a", "done")]
    assert got[0] == seg("a", 10.0, 11.0, "preempted")
    assert marks == [JMark("preempt", 10.9, "a", "for c")]
    later, later_marks = read_timeline(tmp_path / "journal.db", since=11.5)
    assert [s.start for s in later] == [11.0, 12.0] and later_marks == []  # ended after 11.5
    journal.close()


def test_prune_keeps_the_newest_timeline_rows(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.db", keep_segments=3)
    journal.write([seg(f"j{i}", float(i), i + 0.5) for i in range(10)]
                  + [JMark("swap", float(i)) for i in range(10)])
    journal.prune()
    got, marks = read_timeline(tmp_path / "journal.db")
    assert [s.job_id for s in got] == ["j7", "j8", "j9"]
    assert [m.at for m in marks] == [7.0, 8.0, 9.0]
    journal.close()


def test_a_journal_without_timeline_tables_reads_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE jobs (job_id TEXT)")
    db.close()
    assert read_timeline(path) == ([], [])
