"""The results store: one SQLite database (WAL) under ``$UNIUN_HOME/results.db``.

Every producer process, the background-Gana process and the CLI open it at once, so:
WAL mode (readers never block the writer), a generous busy timeout, and every
read-modify-write in ``BEGIN IMMEDIATE`` (the write lock is taken up front, so two
processes cannot both read "not yet fired" and both fire). The schema is versioned
with ``PRAGMA user_version`` and migrated forward on open (``results_schema``).

What is stored (users read the first five with ``uniun-runtime results``):
extracted knowledge (raw model text, parsed JSON or the parse error), note embeddings,
deck cards, Gana runs (timings, finish reason), chat history; and the producers'
bookkeeping: the jobs they handed to the scheduler (persisted *before* submitting, so
a restarted producer re-attaches instead of losing or doubling them) and the Gana fire
claims (the single source of truth for "last fired", shared by gana-cron and the
background-Gana process). Gana fire claims live in ``results_fires``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger

from uniun.actors.producers.results_schema import MIGRATIONS, SCHEMA_VERSION

RESULT_KINDS = ("knowledge", "embedding", "card", "gana", "chat")
BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another process's transaction


class SchemaTooNew(RuntimeError):
    """The database was written by a newer runtime; refusing to touch it."""


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class ResultsStore:
    """A connection to the results database. Thread-safe (one lock around the connection)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                     check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self.migrate()

    # -- plumbing ---------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (rolled back on any exception)."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def schema_version(self) -> int:
        with self._lock:
            return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    def migrate(self) -> int:
        """Bring the schema to ``SCHEMA_VERSION``; each step is its own transaction."""
        while True:
            with self.transaction() as conn:
                version = int(conn.execute("PRAGMA user_version").fetchone()[0])
                if version > SCHEMA_VERSION:
                    raise SchemaTooNew(
                        f"{self.path} has schema version {version}, newer than this runtime's "
                        f"{SCHEMA_VERSION}; upgrade uniun-runtime or move the file away")
                if version == SCHEMA_VERSION:
                    return version
                for statement in _split_sql(MIGRATIONS[version]):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {version + 1}")

    # -- extracted knowledge and embeddings ------------------------------------------

    def add_knowledge(self, *, job_id: str, note_path: str, note_sha: str, model_id: str | None,
                      raw: str, parsed: dict[str, Any] | None, parse_error: str | None,
                      finish_reason: str | None = None, total_s: float | None = None) -> None:
        """Store one extraction (idempotent by ``job_id``: a repeat replaces it)."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO knowledge (job_id, note_path, note_sha, model_id, raw,"
                " parsed, parse_error, finish_reason, total_s, created)"
                " VALUES (?,?,?,?,?,?,?,?,?,?)",
                (job_id, note_path, note_sha, model_id, raw,
                 None if parsed is None else _dumps(parsed), parse_error, finish_reason,
                 total_s, time.time()))

    def put_note_embedding(self, note_path: str, note_sha: str, vector: np.ndarray,
                           model_id: str | None = None) -> None:
        vec = np.ascontiguousarray(vector, dtype="<f4").reshape(-1)
        with self.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO note_embeddings (note_path, note_sha, model_id, dim,"
                " vector, created) VALUES (?,?,?,?,?,?)",
                (note_path, note_sha, model_id, int(vec.size), vec.tobytes(), time.time()))

    def has_knowledge(self, note_path: str, note_sha: str) -> bool:
        """Whether this text of this note was extracted (parse failures count: recorded)."""
        rows = self.query("SELECT 1 FROM knowledge WHERE note_path=? AND note_sha=? LIMIT 1",
                          (note_path, note_sha))
        return bool(rows)

    def knowledge_for(self, note_path: str) -> list[dict[str, Any]]:
        rows = self.query("SELECT * FROM knowledge WHERE note_path=? ORDER BY id", (note_path,))
        out = [dict(r) for r in rows]
        for item in out:
            if item["parsed"] is not None:
                item["parsed"] = _loads_or_raw(item["parsed"])
        return out

    def delete_note_embedding(self, note_path: str) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM note_embeddings WHERE note_path=?", (note_path,))

    def embedded_sha(self, note_path: str) -> str | None:
        rows = self.query("SELECT note_sha FROM note_embeddings WHERE note_path=?", (note_path,))
        return rows[0]["note_sha"] if rows else None

    def note_embeddings(self) -> tuple[list[str], np.ndarray]:
        """All notes' latest embeddings: (paths, matrix of shape [n, dim])."""
        return note_embeddings(self.query)

    # -- deck -------------------------------------------------------------------------

    def add_card(self, job_id: str, topic: str | None, text: str) -> bool:
        """Add a card; False if this job's card is already there (a re-delivered done)."""
        with self.transaction() as conn:
            cur = conn.execute(
                "INSERT OR IGNORE INTO deck_cards (job_id, topic, text, created) VALUES (?,?,?,?)",
                (job_id, topic, text, time.time()))
            return cur.rowcount == 1

    def deck(self, limit: int = 100) -> list[dict[str, Any]]:
        """Cards in the deck (not yet taken), oldest first."""
        rows = self.query("SELECT id, job_id, topic, text, created FROM deck_cards"
                          " WHERE consumed_at IS NULL ORDER BY id LIMIT ?", (limit,))
        return [dict(r) for r in rows]

    def deck_size(self) -> int:
        return int(self.query("SELECT count(*) FROM deck_cards WHERE consumed_at IS NULL")[0][0])

    def take_cards(self, n: int) -> list[dict[str, Any]]:
        """Take the ``n`` oldest cards out of the deck (the user read them)."""
        with self.transaction() as conn:
            rows = conn.execute("SELECT id, job_id, topic, text, created FROM deck_cards"
                                " WHERE consumed_at IS NULL ORDER BY id LIMIT ?", (n,)).fetchall()
            now = time.time()
            conn.executemany("UPDATE deck_cards SET consumed_at=? WHERE id=?",
                             [(now, r["id"]) for r in rows])
        return [dict(r) for r in rows]

    # -- Gana runs and chat -----------------------------------------------------------

    def add_gana_run(self, **run: Any) -> bool:
        """Record a finished Gana run; False if this job's run is already recorded.

        Fields: ``job_id, gana_id, slot, runner, model_id, prompt, text, finish_reason``
        and optionally ``completion_tokens, queued_s, ttft_s, total_s, preemptions,
        started_at``.
        """
        with self.transaction() as conn:
            return insert_gana_run(conn, run)

    def gana_runs(self, gana_id: str | None = None) -> list[dict[str, Any]]:
        if gana_id is None:
            rows = self.query("SELECT * FROM gana_runs ORDER BY id")
        else:
            rows = self.query("SELECT * FROM gana_runs WHERE gana_id=? ORDER BY id", (gana_id,))
        return [dict(r) for r in rows]

    def add_chat_message(self, conversation: str, role: str, content: str, *,
                         job_id: str | None = None,
                         timings: dict[str, Any] | None = None) -> None:
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO chat_messages (conversation, role, content, job_id, timings, created)"
                " VALUES (?,?,?,?,?,?)",
                (conversation, role, content, job_id,
                 None if timings is None else _dumps(timings), time.time()))

    # -- the producers' jobs ----------------------------------------------------------

    def record_job(self, job_id: str, producer: str, job: dict[str, Any],
                   meta: dict[str, Any]) -> bool:
        """Persist a job before it is submitted. False if the id is already known."""
        now = time.time()
        with self.transaction() as conn:
            cur = conn.execute(
                "INSERT OR IGNORE INTO producer_jobs (job_id, producer, job, meta, state,"
                " created, updated) VALUES (?,?,?,?,'pending',?,?)",
                (job_id, producer, _dumps(job), _dumps(meta), now, now))
            return cur.rowcount == 1

    def set_job_state(self, job_id: str, state: str, error: str | None = None) -> None:
        with self.transaction() as conn:
            conn.execute("UPDATE producer_jobs SET state=?, error=?, updated=? WHERE job_id=?",
                         (state, error, time.time(), job_id))

    def job(self, job_id: str) -> dict[str, Any] | None:
        rows = self.query("SELECT * FROM producer_jobs WHERE job_id=?", (job_id,))
        return _job_row(rows[0]) if rows else None

    def open_jobs(self, producer: str) -> list[dict[str, Any]]:
        """Jobs persisted but not finished (pending or submitted), oldest first. A row
        that does not decode is logged, marked ``failed`` (so it is not met again) and
        skipped."""
        rows = self.query("SELECT * FROM producer_jobs WHERE producer=? AND state IN"
                          " ('pending','submitted') ORDER BY created, job_id", (producer,))
        out = []
        for row in rows:
            item = _job_row(row)
            if item is None:
                self.set_job_state(row["job_id"], "failed", "row unreadable")
            else:
                out.append(item)
        return out

    def jobs_with_prefix(self, prefix: str) -> list[dict[str, Any]]:
        """Jobs whose id starts with ``prefix`` (e.g. every attempt at one note)."""
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self.query("SELECT * FROM producer_jobs WHERE job_id LIKE ? ESCAPE '\\'"
                          " ORDER BY created", (escaped + "%",))
        return [item for r in rows if (item := _job_row(r)) is not None]

    def supersede_jobs(self, prefix: str, producer: str,
                       make: Callable[[int], tuple[dict[str, Any], dict[str, Any]]]
                       ) -> tuple[dict[str, Any], list[str]]:
        """Replace the open jobs whose id starts with ``prefix`` by a new one, atomically.

        The open ones become ``superseded`` (their owner ignores their end); ``make(n)``
        builds the new job from the number of jobs with this prefix so far (its attempt
        number). Returns the new job map and the superseded ids (to cancel).
        """
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        now = time.time()
        with self.transaction() as conn:
            rows = conn.execute("SELECT job_id, state FROM producer_jobs WHERE job_id LIKE ?"
                                " ESCAPE '\\'", (escaped + "%",)).fetchall()
            open_ids = [r["job_id"] for r in rows if r["state"] in ("pending", "submitted")]
            conn.executemany("UPDATE producer_jobs SET state='superseded', updated=?"
                             " WHERE job_id=?", [(now, j) for j in open_ids])
            job, meta = make(len(rows))
            conn.execute("INSERT INTO producer_jobs (job_id, producer, job, meta, state,"
                         " created, updated) VALUES (?,?,?,?,'pending',?,?)",
                         (job["job_id"], producer, _dumps(job), _dumps(meta), now, now))
        return job, open_ids

    def adopt_jobs(self, from_producer: str, to_producer: str, idle_s: float, *,
                   owner_gone: Callable[[dict[str, Any]], bool] | None = None) -> int:
        """Hand open jobs of a producer that went quiet (e.g. a killed CLI) to another:
        those untouched for ``idle_s``, and at once those whose meta names an owner that
        ``owner_gone`` says has exited."""
        now = time.time()
        with self.transaction() as conn:
            rows = conn.execute("SELECT job_id, meta, updated FROM producer_jobs WHERE"
                                " producer=? AND state IN ('pending','submitted')",
                                (from_producer,)).fetchall()
            ids = [r["job_id"] for r in rows if r["updated"] < now - idle_s or (
                owner_gone is not None and owner_gone(_meta(r["meta"])))]
            conn.executemany("UPDATE producer_jobs SET producer=?, updated=? WHERE job_id=?",
                             [(to_producer, now, j) for j in ids])
            return len(ids)

    # -- listing (``uniun-runtime results``) ----------------------------------------

    def list_results(self, kind: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Newest results first, each a flat dict with a ``kind`` key."""
        return list_results(self.query, kind, limit)


# -- reading, shared with read-only readers (the console: actors/gateway/console_results.py)

Query = Callable[[str, tuple[Any, ...]], list[sqlite3.Row]]
LIST_SQL = {
    "knowledge": "SELECT 'knowledge' AS kind, created AS at, job_id, note_path, model_id,"
                 " parsed, parse_error, raw, finish_reason, total_s FROM knowledge",
    "embedding": "SELECT 'embedding' AS kind, created AS at, note_path, note_sha,"
                 " model_id, dim FROM note_embeddings",
    "card": "SELECT 'card' AS kind, created AS at, job_id, topic, text, consumed_at"
            " FROM deck_cards",
    "gana": "SELECT 'gana' AS kind, finished_at AS at, job_id, gana_id, slot, runner,"
            " model_id, text, finish_reason, completion_tokens, queued_s, ttft_s,"
            " total_s, preemptions FROM gana_runs",
    "chat": "SELECT 'chat' AS kind, created AS at, conversation, role, content, job_id,"
            " timings FROM chat_messages",
}


def list_results(query: Query, kind: str | None = None, limit: int = 50
                 ) -> list[dict[str, Any]]:
    """Newest results first (of ``kind``, or of every kind), each a flat dict with a
    ``kind`` key; ``query`` runs SQL on a results database (read-only is enough)."""
    if kind is not None and kind not in RESULT_KINDS:
        raise ValueError(f"unknown result kind {kind!r}; one of {', '.join(RESULT_KINDS)}")
    out: list[dict[str, Any]] = []
    for name in (kind,) if kind else RESULT_KINDS:
        rows = query(f"{LIST_SQL[name]} ORDER BY at DESC LIMIT ?", (limit,))
        for row in rows:
            item = dict(row)
            for key in ("parsed", "timings"):
                if item.get(key) is not None:
                    item[key] = _loads_or_raw(item[key])
            out.append(item)
    out.sort(key=lambda r: r["at"], reverse=True)
    return out[:limit]


def note_embeddings(query: Query) -> tuple[list[str], np.ndarray]:
    """All notes' latest embeddings: (paths, matrix of shape [n, dim])."""
    rows = query("SELECT note_path, dim, vector FROM note_embeddings ORDER BY note_path", ())
    if not rows:
        return [], np.zeros((0, 0), dtype=np.float32)
    dims = {r["dim"] for r in rows}
    if len(dims) != 1:
        raise ValueError(f"note embeddings of different sizes {sorted(dims)}; re-embed")
    matrix = np.stack([np.frombuffer(r["vector"], dtype="<f4") for r in rows])
    return [r["note_path"] for r in rows], matrix



def rank(query: np.ndarray, matrix: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Indices and cosine scores of the ``k`` rows of ``matrix`` most similar to ``query``,
    best first (rows and query L2-normalised: cosine is a dot product). ValueError when
    the sizes differ: the notes were embedded by another model."""
    if matrix.shape[0] == 0:
        return []
    if matrix.shape[1] != query.shape[-1]:
        raise ValueError(f"query has {query.shape[-1]} dims, the notes {matrix.shape[1]}: "
                         "they were embedded by a different model")
    scores = matrix @ query.reshape(-1)
    order = np.argsort(-scores, kind="stable")[:k]
    return [(int(i), float(scores[i])) for i in order]

_GANA_RUN_FIELDS = ("job_id", "gana_id", "slot", "runner", "model_id", "prompt", "text",
                    "finish_reason", "completion_tokens", "queued_s", "ttft_s", "total_s",
                    "preemptions", "started_at")


def insert_gana_run(conn: sqlite3.Connection, run: dict[str, Any]) -> bool:
    """INSERT OR IGNORE one Gana run inside the caller's transaction."""
    unknown = set(run) - set(_GANA_RUN_FIELDS)
    if unknown:
        raise ValueError(f"unknown gana run field(s) {sorted(unknown)}")
    values = [run.get(f) for f in _GANA_RUN_FIELDS]
    cols = ", ".join(_GANA_RUN_FIELDS)
    cur = conn.execute(f"INSERT OR IGNORE INTO gana_runs ({cols}, finished_at) VALUES "
                       f"({', '.join('?' * len(values))}, ?)", (*values, time.time()))
    return cur.rowcount == 1


def _job_row(row: sqlite3.Row) -> dict[str, Any] | None:
    """The row with its job and meta decoded; None (and a log line naming the job) when
    they do not decode: one damaged row must not stop a producer from starting."""
    item = dict(row)
    try:
        item["job"] = json.loads(item["job"])
        item["meta"] = json.loads(item["meta"])
        if not isinstance(item["job"], dict) or not isinstance(item["meta"], dict):
            raise TypeError("job and meta must be JSON objects")
    except (TypeError, ValueError) as err:
        logger.bind(job=item.get("job_id")).error(
            "results.db: producer job row {!r} unreadable, skipped: {}", item.get("job_id"), err)
        return None
    return item


def _meta(text: str | None) -> dict[str, Any]:
    """A job row's meta; an undecodable one reads as empty (its owner is unknown)."""
    value = _loads_or_raw(text or "{}")
    return value if isinstance(value, dict) else {}


def _loads_or_raw(text: str) -> Any:
    """JSON-decoded ``text``, or the text itself when it does not decode (listing only)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _split_sql(script: str) -> list[str]:
    """Statements of a migration script (our scripts have no ';' inside literals)."""
    lines = [line.split("--", 1)[0] for line in script.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
