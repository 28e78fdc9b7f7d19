"""The journal's timeline tables: segments and marks written with the job writes, read
back by ``read_timeline`` (a separate read-only connection), pruned to the newest rows."""

from __future__ import annotations

import sqlite3
from dataclasses import MISSING, fields
from pathlib import Path

from uniun.actors.scheduler.journal import Journal, read_timeline
from uniun.actors.timeline import Mark, Segment


def seg(job: str, start: float, end: float, reason: str = "done", lane: str = "run") -> Segment:
    return Segment(job, lane, "nataraj", "nataraj", 4, "m", start, end, reason, 3)


def test_segments_and_marks_round_trip_and_since_filters(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.db")
    journal.write([seg("a", 10.0, 11.0, "preempted"), Mark("preempt", 10.9, "a", "for c"),
                   seg("c", 11.0, 12.0), seg("a", 12.0, 15.0)])
    got, marks = read_timeline(tmp_path / "journal.db")
    assert [(s.job_id, s.reason) for s in got] == [("a", "preempted"), ("c", "done"),
                                                   ("a", "done")]
    assert got[0] == seg("a", 10.0, 11.0, "preempted")
    assert marks == [Mark("preempt", 10.9, "a", "for c")]
    later, later_marks = read_timeline(tmp_path / "journal.db", since=11.5)
    assert [s.start for s in later] == [11.0, 12.0] and later_marks == []  # ended after 11.5
    journal.close()


def test_prune_keeps_the_newest_timeline_rows(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.db", keep_segments=3)
    journal.write([seg(f"j{i}", float(i), i + 0.5) for i in range(10)]
                  + [Mark("swap", float(i)) for i in range(10)])
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


def test_the_timeline_tables_are_the_records_fields(tmp_path: Path) -> None:
    """A field added to Segment or Mark is a column of the journal, in the same place;
    a field with a default is a column with that default, an optional one nullable."""
    Journal(tmp_path / "journal.db").close()
    db = sqlite3.connect(tmp_path / "journal.db")
    for table, record in (("segments", Segment), ("marks", Mark)):
        columns = [(name, bool(notnull), default) for _, name, _, notnull, default, _ in
                   db.execute(f"PRAGMA table_info({table})")]
        want = [(f.name, f.default is not None,
                 None if f.default in (MISSING, None) else repr(f.default))
                for f in fields(record)]
        assert columns == want, table
    db.close()


# The timeline tables as the journal wrote them when their DDL was spelled by hand.
_FIRST_DDL = """
CREATE TABLE segments (job_id TEXT NOT NULL, lane TEXT NOT NULL, kind TEXT NOT NULL,
    flow TEXT NOT NULL, tier INTEGER NOT NULL, model_id TEXT NOT NULL, start REAL NOT NULL,
    end REAL NOT NULL, reason TEXT NOT NULL, tokens INTEGER NOT NULL DEFAULT 0);
CREATE INDEX segments_end ON segments (end);
CREATE TABLE marks (what TEXT NOT NULL, at REAL NOT NULL, job_id TEXT,
    detail TEXT NOT NULL DEFAULT '');
CREATE INDEX marks_at ON marks (at);
INSERT INTO segments VALUES ('old', 'run', 'gana', 'g', 4, 'm', 1.0, 2.0, 'done', 5);
INSERT INTO marks VALUES ('runner_up', 0.5, NULL, 'pid 7');
"""


def test_a_journal_written_before_the_tables_were_derived_is_read_and_extended(
        tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    db = sqlite3.connect(path)
    db.executescript(_FIRST_DDL)
    db.close()
    journal = Journal(path)
    journal.write([seg("new", 3.0, 4.0)])
    journal.close()
    got, marks = read_timeline(path)
    assert got == [Segment("old", "run", "gana", "g", 4, "m", 1.0, 2.0, "done", 5),
                   seg("new", 3.0, 4.0)]
    assert marks == [Mark("runner_up", 0.5, None, "pid 7")]
