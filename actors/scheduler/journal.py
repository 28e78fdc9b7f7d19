"""The job journal: every acknowledged job, on disk, until it is done.

Titanic's rule (zguide): persist a request *before* acknowledging it. The scheduler
writes a job here, commits, and only then sends ``accepted``; so a job a client was told
about survives a scheduler crash. While the job runs, every streamed token is appended
(id and text), so a restarted scheduler knows exactly what the client has already seen
and the job continues after it: no token is lost and none is generated twice.

When a job ends its row is marked with its terminal event (``done`` or ``error``) and
its tokens are deleted; the last ``keep_done`` finished rows are kept so that an
``attach`` or an idempotent re-``submit`` after a restart still gets the outcome.

SQLite in WAL mode. Durability is chosen per commit (``[journal] synchronous``):

- ``full`` (default): a commit that records what a client was told — a job accepted, a
  cancel acknowledged, a job's end — runs with ``synchronous=FULL``: the log is flushed
  to the disk before the reply goes out, so "accepted" survives a power cut, not only a
  crash of the runtime. Commits of streamed tokens and timeline rows run with
  ``NORMAL`` (no flush): the log is append-only, so the next flushed commit makes them
  durable too. A power cut can therefore cost a running job the tokens streamed since
  the last flushed commit (it resumes from the last durable token), never a job.
  Submits are batched (the host commits up to a chunk of requests at once), so a burst
  pays one flush per batch, not one per job; ``uniun-runtime bench`` measures it.
- ``normal``: no commit flushes; durable against a crash of the runtime, and a power cut
  may lose the last commits.

Acknowledged means kept: replay never deletes an accepted job. A spec is re-checked for
its shape only; the size limits it passed when it was accepted (``[limits]
max_prompt_chars``, ``max_new_tokens_cap``) are not applied again, so lowering a limit
cannot lose a job. A job replay cannot use (``journal_replay.py`` says why) — a live
job whose kind today's ``[jobs] kinds`` no longer has, or a row whose spec, outcome or
tokens cannot be decoded — is *moved* to the ``dead_letters`` table (the whole row as
it was, its tokens to ``dead_tokens``) with the reason and the time, in one
transaction, logged with its job id; ``status`` lists them and an ``attach`` names the
reason (``dead_letters.py``). The runtime never deletes a dead letter. A file SQLite
itself calls corrupt is moved aside before the journal is opened
(``runtime/quarantine.py``). One connection: the main thread replays, then only the
scheduler host actor writes.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from types import UnionType
from typing import Any, ClassVar, Literal, Union, get_args, get_origin, get_type_hints

import msgpack
from loguru import logger

from uniun.actors.scheduler.dead_letters import DeadLetter, DeadLetters
from uniun.actors.scheduler.effects import (
    JAccept,
    JCancelAsked,
    JFinish,
    JournalWrite,
    JPaused,
    JStarted,
    JToken,
)
from uniun.actors.scheduler.journal_replay import JournalEntry, Unschedulable, entry_of
from uniun.actors.timeline import Mark, Segment

__all__ = ["Journal", "JournalEntry", "KEEP_DEAD_LETTERS", "KEEP_SEGMENTS", "Unschedulable",
           "read_timeline"]

SYNCHRONOUS = ("full", "normal")  # the first is the default
# Writes that record what a client was told: under "full" their commit is flushed.
_ACKNOWLEDGED = (JAccept, JCancelAsked, JFinish)
PRUNE_EVERY = 100  # finished jobs between two prunes of the kept outcomes
KEEP_SEGMENTS = 100_000  # timeline rows kept (segments and marks each; ~100 bytes a row)
KEEP_DEAD_LETTERS = 1000  # dead letters the scheduler holds for attach (the table keeps all)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id      TEXT PRIMARY KEY,
    spec        BLOB NOT NULL,      -- msgpack of JobSpec.to_map()
    accepted_at REAL NOT NULL,      -- unix seconds
    seed        INTEGER,            -- effective sampling seed, once drawn
    started     INTEGER NOT NULL DEFAULT 0,  -- 1 once a segment started
    preemptions INTEGER NOT NULL DEFAULT 0,
    first_token_at REAL,
    started_at  REAL,
    final       BLOB,               -- msgpack of the terminal event; NULL while active
    finished_at REAL,
    cancel_asked INTEGER NOT NULL DEFAULT 0,  -- 1: a cancel was acknowledged while it ran
    owner       TEXT                -- the CURVE key that submitted it; NULL without CURVE
);
CREATE INDEX IF NOT EXISTS jobs_active ON jobs (final, accepted_at);
CREATE TABLE IF NOT EXISTS tokens (
    job_id   TEXT NOT NULL,
    seq      INTEGER NOT NULL,
    token_id INTEGER NOT NULL,
    text     TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dead_letters (
    letter      INTEGER PRIMARY KEY,  -- a job id may be dead-lettered more than once
    job_id,                           -- the jobs row's columns, values as they were
    spec, accepted_at, seed, started, preemptions, first_token_at, started_at, final,
    finished_at, cancel_asked, owner,
    kind        TEXT,                 -- the job's kind, when its spec could be read
    reason      TEXT NOT NULL,        -- why replay could not use it
    at          REAL NOT NULL         -- unix seconds: when replay moved it here
);
CREATE INDEX IF NOT EXISTS dead_letters_at ON dead_letters (at);
CREATE TABLE IF NOT EXISTS dead_tokens (  -- the tokens rows of a dead letter, as they were
    letter   INTEGER NOT NULL,
    seq, token_id, text,
    PRIMARY KEY (letter, seq)
) WITHOUT ROWID;
"""
# The jobs columns a dead letter keeps, in the order of both tables.
_JOB_COLUMNS = ("job_id, spec, accepted_at, seed, started, preemptions, first_token_at, "
                "started_at, final, finished_at, cancel_asked, owner")


@dataclass(frozen=True)
class _RecordTable:
    """A table whose columns are a record's dataclass fields, in order, so a field is
    spelled once (in :mod:`uniun.actors.timeline`) and the schema, the INSERT and the
    SELECT follow it. Types: str TEXT, int INTEGER, float REAL (a ``Literal`` of strings
    is TEXT); ``| None`` makes a column nullable; a field's default is the column's.
    ``at``: the time column the table is pruned and read by; ``order``: the read order.
    """

    name: str
    record: type
    at: str
    order: str

    @property
    def columns(self) -> list[str]:
        return [f.name for f in fields(self.record)]

    def create(self) -> str:
        hints = get_type_hints(self.record)
        cols = [f"{f.name} {_column(hints[f.name], f.default)}" for f in fields(self.record)]
        return (f"CREATE TABLE IF NOT EXISTS {self.name} ({', '.join(cols)});\n"
                f"CREATE INDEX IF NOT EXISTS {self.name}_{self.at} ON {self.name} ({self.at});")

    def insert(self) -> str:
        return f"INSERT INTO {self.name} VALUES ({', '.join('?' * len(self.columns))})"

    def select(self) -> str:
        return (f"SELECT {', '.join(self.columns)} FROM {self.name} WHERE {self.at} >= ? "
                f"ORDER BY {self.order}")

    def row(self, record: Any) -> tuple[Any, ...]:
        return tuple(getattr(record, name) for name in self.columns)


_SQL_TYPES = {str: "TEXT", int: "INTEGER", float: "REAL"}


def _column(hint: Any, default: Any) -> str:
    """``TYPE [NOT NULL] [DEFAULT x]`` of a field annotated ``hint``."""
    args = [a for a in get_args(hint) if a is not type(None)]
    nullable = get_origin(hint) in (Union, UnionType) and len(args) < len(get_args(hint))
    if nullable:
        (hint,) = args
    if get_origin(hint) is Literal:
        hint = type(get_args(hint)[0])
    sql = _SQL_TYPES[hint] + ("" if nullable else " NOT NULL")
    if default is not MISSING and default is not None:
        sql += f" DEFAULT {default!r}"
    return sql


# The timeline (docs/observability.md): one row per stretch a job ran or waited, written
# when it ends, and instants (preempt, swap, restarts). Pruned to the newest rows.
_SEGMENTS = _RecordTable("segments", Segment, at="end", order="start, rowid")
_MARKS = _RecordTable("marks", Mark, at="at", order="at, rowid")


class Journal:
    """SQLite-backed journal of accepted jobs (see module docstring)."""

    def __init__(self, path: Path, *, keep_done: int = 1000,
                 keep_segments: int = KEEP_SEGMENTS, synchronous: str = "full") -> None:
        if synchronous not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}, "
                             f"not {synchronous!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.keep_done = keep_done
        self.keep_segments = keep_segments
        # check_same_thread off: the main thread replays, then only the host actor writes.
        self._db = sqlite3.connect(str(path), isolation_level=None, timeout=10.0,
                                   check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self.synchronous = synchronous
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._flushing = False  # the connection's synchronous is FULL right now
        self._db.executescript(_SCHEMA + _SEGMENTS.create() + _MARKS.create())
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(jobs)")}
        if "cancel_asked" not in columns:  # a journal from before the column existed
            self._db.execute("ALTER TABLE jobs ADD COLUMN cancel_asked INTEGER NOT NULL "
                             "DEFAULT 0")
        if "owner" not in columns:
            self._db.execute("ALTER TABLE jobs ADD COLUMN owner TEXT")
        self._finished_since_prune = 0

    def close(self) -> None:
        self._db.close()

    # ---- writes ---------------------------------------------------------------------

    def write(self, writes: Sequence[JournalWrite]) -> None:
        """Apply ``writes`` in order, in one transaction: all of them or none.

        The host calls this before it sends what the writes record, so one commit covers
        a whole batch of inputs (a burst of submits costs one fsync, not thousands).
        """
        if not writes:
            return
        self._flush_commit(self.synchronous == "full"
                           and any(isinstance(w, _ACKNOWLEDGED) for w in writes))
        finished = 0
        with self._db:
            self._db.execute("BEGIN")
            for w in writes:
                self._APPLY[type(w)](self, w)
                finished += isinstance(w, JFinish)
        self._finished_since_prune += finished
        if self._finished_since_prune >= PRUNE_EVERY:
            self.prune()

    def _flush_commit(self, flush: bool) -> None:
        """FULL (flush the log at commit) or NORMAL for the next commit; set only when
        it changes (a pragma between transactions is cheap, but not free)."""
        if flush != self._flushing:
            self._db.execute(f"PRAGMA synchronous={'FULL' if flush else 'NORMAL'}")
            self._flushing = flush

    def _accept(self, w: JAccept) -> None:
        blob = msgpack.packb(w.spec.to_map(), use_bin_type=True)
        # a finished job pruned from memory may come back under its id
        self._db.execute("DELETE FROM tokens WHERE job_id = ?", (w.spec.job_id,))
        self._db.execute("INSERT OR REPLACE INTO jobs (job_id, spec, accepted_at, owner) "
                         "VALUES (?, ?, ?, ?)", (w.spec.job_id, blob, w.at, w.owner))

    def _started(self, w: JStarted) -> None:
        self._db.execute(
            "UPDATE jobs SET started = 1, seed = ?, started_at = COALESCE(started_at, ?) "
            "WHERE job_id = ?", (w.seed, w.at, w.job_id))

    def _token(self, w: JToken) -> None:
        """One streamed token (``INSERT OR IGNORE``: a replayed seq is harmless)."""
        self._db.execute("INSERT OR IGNORE INTO tokens VALUES (?, ?, ?, ?)",
                         (w.job_id, w.seq, w.token_id, w.text))
        if w.seq == 0:
            self._db.execute("UPDATE jobs SET first_token_at = ? WHERE job_id = ? "
                             "AND first_token_at IS NULL", (w.at, w.job_id))

    def _paused(self, w: JPaused) -> None:
        self._db.execute("UPDATE jobs SET preemptions = ? WHERE job_id = ?",
                         (w.preemptions, w.job_id))

    def _finish(self, w: JFinish) -> None:
        """Mark a job ended with its terminal event; drop its tokens."""
        blob = msgpack.packb(w.final, use_bin_type=True)
        self._db.execute("UPDATE jobs SET final = ?, finished_at = ? WHERE job_id = ?",
                         (blob, w.at, w.job_id))
        self._db.execute("DELETE FROM tokens WHERE job_id = ?", (w.job_id,))

    def _cancel_asked(self, w: JCancelAsked) -> None:
        self._db.execute("UPDATE jobs SET cancel_asked = 1 WHERE job_id = ?", (w.job_id,))

    def _segment(self, w: Segment) -> None:
        self._db.execute(_SEGMENTS.insert(), _SEGMENTS.row(w))

    def _mark(self, w: Mark) -> None:
        self._db.execute(_MARKS.insert(), _MARKS.row(w))

    def _entry(self, row: tuple[Any, ...], **rules: Any) -> JournalEntry:
        return entry_of(self._db, row, **rules)

    _APPLY: ClassVar[dict[type, Callable[[Journal, Any], None]]] = {
        JAccept: _accept, JStarted: _started, JToken: _token, JPaused: _paused,
        JFinish: _finish, JCancelAsked: _cancel_asked, Segment: _segment, Mark: _mark,
    }

    def prune(self) -> None:
        """Keep only the newest ``keep_done`` finished jobs."""
        self._finished_since_prune = 0
        self._db.execute(
            "DELETE FROM jobs WHERE final IS NOT NULL AND job_id NOT IN ("
            "SELECT job_id FROM jobs WHERE final IS NOT NULL "
            "ORDER BY finished_at DESC LIMIT ?)", (self.keep_done,))
        for table in (_SEGMENTS.name, _MARKS.name):
            self._db.execute(f"DELETE FROM {table} WHERE rowid <= "
                             f"(SELECT MAX(rowid) FROM {table}) - ?", (self.keep_segments,))

    # ---- replay ---------------------------------------------------------------------

    def replay(self, *, default_model: str, kinds: tuple[str, ...],
               max_new_tokens_cap: int) -> list[JournalEntry]:
        """Every journaled job, oldest first: active ones with their tokens, and the
        kept finished ones with their terminal event. A row it cannot use is moved to
        the dead letters, never deleted (module docstring)."""
        started = time.monotonic()
        out: list[JournalEntry] = []
        rows = self._db.execute(
            "SELECT job_id, spec, accepted_at, seed, started, preemptions, started_at, "
            "first_token_at, final, cancel_asked, owner FROM jobs ORDER BY accepted_at, rowid"
        ).fetchall()
        moved = 0
        for row in rows:
            try:
                entry = self._entry(row, default_model=default_model, kinds=kinds,
                                    max_new_tokens_cap=max_new_tokens_cap)
            except sqlite3.DatabaseError:
                raise  # the file itself is damaged: the caller moves it aside
            except Unschedulable as err:
                self._move_to_dead_letters(row[0], str(err), err.kind)
                moved += 1
                continue
            except Exception as err:  # noqa: BLE001 - a row we cannot read must not stop the others
                self._move_to_dead_letters(row[0], f"unreadable: {type(err).__name__}: {err}",
                                           None)
                moved += 1
                continue
            out.append(entry)
        logger.info("journal replayed {} jobs ({} active) in {:.3f} s; {} moved to the dead "
                    "letters", len(out), sum(e.final is None for e in out),
                    time.monotonic() - started, moved)
        return out

    def _move_to_dead_letters(self, job_id: Any, reason: str, kind: str | None) -> None:
        """Move a job's row and its tokens, as they are, to the dead letters: one
        transaction, so a crash halfway leaves the row where it was (and the next replay
        moves it). Not flushed: nothing was told to a client."""
        logger.bind(job=job_id).error("journal row of job {!r} moved to the dead letters: {}",
                                      job_id, reason)
        with self._db:
            self._db.execute("BEGIN")
            letter = self._db.execute(
                f"INSERT INTO dead_letters ({_JOB_COLUMNS}, kind, reason, at) "
                f"SELECT {_JOB_COLUMNS}, ?, ?, ? FROM jobs WHERE job_id = ?",
                (kind, reason, time.time(), job_id)).lastrowid
            self._db.execute("INSERT INTO dead_tokens SELECT ?, seq, token_id, text "
                             "FROM tokens WHERE job_id = ?", (letter, job_id))
            self._db.execute("DELETE FROM tokens WHERE job_id = ?", (job_id,))
            self._db.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))

    def dead_letters(self, keep: int = KEEP_DEAD_LETTERS) -> DeadLetters:
        """The newest ``keep`` dead letters and the count of all (for ``status`` and
        ``attach``; the table itself keeps every one)."""
        (count,) = self._db.execute("SELECT COUNT(*) FROM dead_letters").fetchone()
        rows = self._db.execute("SELECT job_id, reason, at, kind, owner FROM dead_letters "
                                "ORDER BY letter DESC LIMIT ?", (keep,)).fetchall()
        return DeadLetters((DeadLetter(str(job_id), str(reason), float(at),
                                       kind if isinstance(kind, str) else None,
                                       owner if isinstance(owner, str) else None)
                            for job_id, reason, at, kind, owner in rows), count=count)


def read_timeline(path: Path, *, since: float | None = None
                  ) -> tuple[list[Segment], list[Mark]]:
    """The journal's timeline rows (segments that ended, and marks) at or after ``since``
    (unix seconds; None: all kept), oldest first.

    Opens its own read-only connection, so it works beside a running scheduler (WAL lets
    readers in while it writes) and after the runtime stopped. A journal from before the
    timeline existed has no rows, not an error.
    """
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0)
    try:
        tables = {name for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {_SEGMENTS.name, _MARKS.name} <= tables:
            return [], []
        low = -1e300 if since is None else since
        segments = [Segment(*row) for row in db.execute(_SEGMENTS.select(), (low,))]
        marks = [Mark(*row) for row in db.execute(_MARKS.select(), (low,))]
        return segments, marks
    finally:
        db.close()
