"""Files under UNIUN_HOME: what ``start`` tightens, and how a corrupt database is moved aside.

Real files and real SQLite databases in a temporary home; the end-to-end side (a real
runtime's modes, a runtime starting over a corrupt journal) is in
tests/integration/test_home_files_wire.py.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from uniun.runtime.paths import secure_home
from uniun.runtime.quarantine import (
    check_database,
    quarantine,
    quarantine_if_corrupt,
    read_records,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _write(path: Path, text: str = "x", perm: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, perm)
    return path


def test_start_makes_the_home_owner_only_and_tightens_what_was_left_open(tmp_path: Path
                                                                          ) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o755)
    data = [_write(home / n) for n in ("journal.db", "journal.db-wal", "journal.db-shm",
                                        "results.db", "results.db-wal", "chat.jsonl",
                                        "journal.db.corrupt-20240101T000000Z")]
    logs = [_write(home / "logs" / n) for n in ("scheduler.log", "scheduler.log.1", "x.out")]
    os.chmod(home / "logs", 0o755)
    old_run = _write(home / "run" / "http.endpoint")
    os.chmod(home / "run", 0o755)
    notes = _write(home / "notes" / "mine.md")  # the user's own notes: not ours to change
    model = _write(home / "models" / "m" / "model.onnx")  # no private data
    config = _write(home / "uniun.toml")  # written by the user; holds no data
    outside = _write(tmp_path / "elsewhere.db")
    (home / "linked.db").symlink_to(outside)  # a link is not followed

    changed = secure_home(home)

    assert mode(home) == 0o700 and mode(home / "logs") == 0o700
    for path in (*data, *logs, old_run):
        assert mode(path) == 0o600, path
    for path in (notes, model, config, outside):
        assert mode(path) == 0o644, path
    assert set(changed) == {home, home / "logs", home / "run", *data, *logs, old_run}
    assert secure_home(home) == []  # nothing left to do


def test_a_directory_without_its_execute_bit_stays_usable(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    os.chmod(home / "logs", 0o644)
    secure_home(home)
    assert mode(home / "logs") == 0o700


def test_a_missing_home_is_created_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        secure_home(tmp_path / "new" / "home")
    finally:
        os.umask(old)
    assert mode(tmp_path / "new" / "home") == 0o700


def test_the_cli_runs_with_umask_077(tmp_path: Path) -> None:
    """A command that creates the home and a database creates them owner-only, even from
    a shell whose umask would make them world-readable."""
    home = tmp_path / "home"
    env = {**os.environ, "UNIUN_HOME": str(home), "UNIUN_MODELS": str(tmp_path / "models")}
    out = subprocess.run([sys.executable, "-m", "uniun.runtime", "results"], env=env,
                         capture_output=True, text=True, umask=0o022, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    written = {str(p): oct(mode(p)) for p in (home, *home.rglob("*"))}
    assert str(home / "results.db") in written
    assert all(mode(Path(p)) & 0o077 == 0 for p in written), written


def _database(path: Path, rows: int = 50) -> Path:
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    with db:
        db.execute("CREATE TABLE t (x TEXT)")
        db.executemany("INSERT INTO t VALUES (?)", [(f"row {i}" * 20,) for i in range(rows)])
    db.close()
    return path


def test_a_healthy_or_absent_database_is_not_corrupt(tmp_path: Path) -> None:
    assert check_database(_database(tmp_path / "ok.db")) is None
    assert check_database(tmp_path / "absent.db") is None


def test_garbage_and_a_damaged_page_are_corrupt(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not sqlite at all " * 500)
    assert "not a database" in (check_database(garbage) or "")

    damaged = _database(tmp_path / "damaged.db", rows=2000)
    size = damaged.stat().st_size
    with damaged.open("r+b") as fh:  # scribble over a page in the middle of the table
        fh.seek(size // 2)
        fh.write(b"\xff" * 4096)
    assert check_database(damaged) is not None


def test_a_locked_database_is_not_moved_aside(tmp_path: Path) -> None:
    """Only corruption counts: a database another process holds is an error, not junk."""
    path = _database(tmp_path / "busy.db")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=DELETE")  # so an exclusive lock shuts readers out
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            quarantine_if_corrupt(path, tmp_path, busy_timeout_s=0.1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert path.exists() and read_records(tmp_path) == []


def test_quarantine_moves_the_file_with_its_side_files_under_one_new_name(tmp_path: Path
                                                                          ) -> None:
    path = tmp_path / "journal.db"
    for side, text in (("", "main"), ("-wal", "log"), ("-shm", "index")):
        Path(f"{path}{side}").write_text(text)
    first = quarantine(path, now=0.0)
    assert first.name == "journal.db.corrupt-19700101T000000Z"
    assert [Path(f"{first}{s}").read_text() for s in ("", "-wal", "-shm")] == \
        ["main", "log", "index"]
    assert not any(Path(f"{path}{s}").exists() for s in ("", "-wal", "-shm"))
    path.write_text("again")  # corrupt again within the same second: a second name
    second = quarantine(path, now=0.0)
    assert second.name == "journal.db.corrupt-19700101T000000Z-1"
    assert second.read_text() == "again" and first.read_text() == "main"


def test_quarantine_if_corrupt_records_what_it_moved(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    healthy = _database(tmp_path / "results.db")
    assert quarantine_if_corrupt(healthy, run) is None and read_records(run) == []
    bad = tmp_path / "journal.db"
    bad.write_bytes(b"\x00garbage" * 100)
    record = quarantine_if_corrupt(bad, run, clock=lambda: 86400.0)
    assert record == {"file": "journal.db", "moved_to": "journal.db.corrupt-19700102T000000Z",
                      "reason": "file is not a database", "at": 86400.0}
    assert read_records(run) == [record] and not bad.exists()
    assert mode(run / "quarantined.json") == 0o600


def test_status_shows_what_was_moved_aside() -> None:
    from rich.console import Console

    from uniun.runtime.commands.status import render

    status = {"ready": True, "quarantined": [
        {"file": "journal.db", "moved_to": "journal.db.corrupt-20240101T000000Z",
         "reason": "file is not a database", "at": 1.0}]}
    console = Console(width=200, record=True)
    console.print(render(status, "ipc:///x"))
    text = console.export_text()
    assert "journal.db was corrupt (file is not a database); moved to " \
           "journal.db.corrupt-20240101T000000Z" in text
    console = Console(width=200, record=True)
    console.print(render({"ready": True}, "ipc:///x"))
    assert "quarantined" not in console.export_text()
