"""A corrupt database at start is moved aside, not fatal (docs/runtime.md, "Files").

The journal (``journal.db``) and the results store (``results.db``) are SQLite files. A
power cut on a disk that lies about flushes, a full disk or a stray write can leave one
unreadable; a runtime that then refuses to start (or crash-loops on the first read)
keeps the user from every other job. So before a database is opened for the day it is
checked (``PRAGMA quick_check``), and a corrupt one is renamed to
``NAME.corrupt-<UTC time>`` with its ``-wal`` and ``-shm`` beside it under the same new
name (so ``sqlite3 NAME.corrupt-...`` still sees its log), and a fresh one is made.

Who checks what: ``start`` checks ``results.db`` once, holding the runtime's lock and
before any producer opens it (several processes share it); the scheduler checks
``journal.db``, its own file, every time it starts, so a journal that breaks while the
runtime runs is dealt with on the scheduler's restart. Each move is logged, printed by
``start`` and recorded in ``run/quarantined.json``, which the scheduler reports in
``status`` (``quarantined``) for the life of the runtime.

Only corruption counts: "database is locked" or a permission error is not a reason to
move a user's data away, and is raised as it is.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from uniun.runtime.state import write_private

__all__ = ["RECORDS_FILE", "add_record", "check_database", "is_corruption", "moved_aside",
           "quarantine", "quarantine_if_corrupt", "read_records", "reset_records"]

RECORDS_FILE = "quarantined.json"  # in the run dir: what this runtime moved aside
SIDE_FILES = ("-wal", "-shm")  # SQLite's log and shared-memory index, beside the file
_CORRUPT_CODES = {getattr(sqlite3, "SQLITE_CORRUPT", 11), getattr(sqlite3, "SQLITE_NOTADB", 26)}


def is_corruption(err: BaseException) -> bool:
    """True for SQLite's "malformed" and "not a database" errors, nothing else."""
    if not isinstance(err, sqlite3.DatabaseError):
        return False
    code = getattr(err, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _CORRUPT_CODES
    text = str(err).lower()
    return "malformed" in text or "not a database" in text


BUSY_TIMEOUT_S = 30.0  # how long the check waits for another process's write lock


def check_database(path: Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> str | None:
    """Why ``path`` is corrupt, or None (absent, or healthy by ``PRAGMA quick_check``).

    Raises ``sqlite3.Error`` for anything that is not corruption (a lock held longer
    than ``busy_timeout_s`` seconds, permissions).
    """
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True,
                             timeout=busy_timeout_s)
    except sqlite3.DatabaseError as err:
        if is_corruption(err):
            return str(err)
        raise
    try:
        rows = [str(r[0]) for r in db.execute("PRAGMA quick_check(5)").fetchall()]
    except sqlite3.DatabaseError as err:
        if is_corruption(err):
            return str(err)
        raise
    finally:
        db.close()
    return None if rows == ["ok"] else "; ".join(rows)


def quarantine(path: Path, *, now: float | None = None) -> Path:
    """Move ``path`` and its side files to ``path.corrupt-<UTC time>``; the new path.

    Side files move first: a stale ``-wal`` left beside a fresh database could be
    replayed into it.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while any(Path(f"{target}{side}").exists() for side in ("", *SIDE_FILES)):
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    for side in (*SIDE_FILES, ""):
        src = Path(f"{path}{side}")
        if src.exists():
            os.replace(src, Path(f"{target}{side}"))
    return target


def quarantine_if_corrupt(path: Path, run_dir: Path, *,
                          clock: Callable[[], float] = time.time,
                          busy_timeout_s: float = BUSY_TIMEOUT_S) -> dict[str, Any] | None:
    """Check ``path``; if corrupt, move it aside, log it, record it; the record or None."""
    reason = check_database(path, busy_timeout_s=busy_timeout_s)
    if reason is None:
        return None
    return moved_aside(path, reason, run_dir, clock=clock)


def moved_aside(path: Path, reason: str, run_dir: Path, *,
                clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """Move a database known to be corrupt aside, log and record it; the record."""
    now = clock()
    target = quarantine(path, now=now)
    record = {"file": path.name, "moved_to": target.name, "reason": reason[:200],
              "at": round(now, 3)}
    logger.error("{} is corrupt ({}); moved it aside to {} (with its -wal/-shm) and "
                 "starting with a new one", path, reason, target)
    add_record(run_dir, record)
    return record


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """What this runtime moved aside so far (an unreadable record file reads as none)."""
    try:
        records = json.loads((run_dir / RECORDS_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []


def add_record(run_dir: Path, record: dict[str, Any]) -> None:
    write_private(run_dir / RECORDS_FILE, json.dumps([*read_records(run_dir), record]))


def reset_records(run_dir: Path) -> None:
    """A new runtime starts with no records (called by ``start`` under its lock)."""
    with contextlib.suppress(FileNotFoundError):
        (run_dir / RECORDS_FILE).unlink()
