"""A real runtime's files: owner-only, and a corrupt database costs its own data only.

``uniun-runtime start`` over a private home, launched with umask 022 (a usual shell's),
over files an older runtime left world-readable; then over a journal and a results store
full of garbage, and over a journal with one undecodable row.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

from tests.integration.harness import BASE_CONFIG, Runtime, chat_job
from tests.wait import wait_for
from uniun.actors.producers.results import ResultsStore
from uniun.actors.scheduler.effects import JAccept, JFinish
from uniun.actors.scheduler.journal import Journal
from uniun.protocol.jobmap import validate_job

# The gana producer opens results.db; with no Ganas file and no samples it submits nothing.
CHILDREN = "scheduler,runner,gana"
DATA = ("journal.db", "journal.db-wal", "journal.db-shm", "results.db", "results.db-wal",
        "results.db-shm")


def _config() -> str:
    return BASE_CONFIG.replace("background_gana = false\n",
                               "background_gana = false\nsamples = false\n")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _runtime(home: Path) -> Runtime:
    rt = Runtime(home, _config())
    rt.env["UNIUN_CHILDREN"] = CHILDREN
    rt.umask = 0o022
    return rt


def _spec(job_id: str, kind: str = "extract", **extra: object):
    return validate_job({"job_id": job_id, "kind": kind, "prompt": "hello world",
                         "max_new_tokens": 8, **extra}, default_model="tiny-1")


def _chat_is_answered(rt: Runtime, job_id: str) -> None:
    w = rt.wire()
    assert w.submit(chat_job(job_id))["type"] == "accepted"
    assert w.end(job_id)["type"] == "done", rt.logs()


def test_a_runtime_leaves_nothing_readable_by_other_users(tmp_path: Path,
                                                         tiny_model: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o755)
    old = os.umask(0o022)  # what an older runtime, without its own umask, left behind
    try:
        journal = Journal(home / "journal.db")
        journal.write([JAccept(_spec("old"), at=1.0),
                       JFinish("old", {"type": "done", "job_id": "old", "text": "x"}, at=2.0)])
        journal.close()
        ResultsStore(home / "results.db").close()
        (home / "logs").mkdir()
        (home / "logs" / "scheduler.log.1").write_text("an old log")
        (home / "history.jsonl").write_text("{}\n")
    finally:
        os.umask(old)
    before = {p.name: mode(p) for p in home.rglob("*") if p.is_file()}
    assert before["journal.db"] == 0o644 and before["results.db"] == 0o644

    rt = _runtime(home)
    rt.start()
    try:
        _chat_is_answered(rt, "files-chat")
        wait_for("results.db and its side files",
                 lambda: all((home / n).exists() for n in DATA))
        ours = {home / "uniun.toml", home / "start.out"}  # the test wrote these
        modes = {str(p.relative_to(home)): oct(mode(p))
                 for p in (home, *home.rglob("*")) if p not in ours}
        open_to_others = {p: m for p, m in modes.items() if int(m, 8) & 0o077}
        assert open_to_others == {}, open_to_others
        assert mode(home) == 0o700
        for name in (*DATA, "history.jsonl", "logs/scheduler.log.1", "logs/scheduler.log"):
            assert mode(home / name) == 0o600, name
        for name in ("run", "logs"):
            assert mode(home / name) == 0o700, name
    finally:
        rt.stop()


def test_a_corrupt_journal_and_results_store_are_moved_aside_and_the_runtime_serves(
        tmp_path: Path, tiny_model: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    garbage = os.urandom(64 * 1024)
    (home / "journal.db").write_bytes(garbage)
    (home / "journal.db-wal").write_bytes(garbage[:999])
    (home / "results.db").write_bytes(b"results " * 4096)

    rt = _runtime(home)
    rt.start()
    try:
        _chat_is_answered(rt, "after-corruption")
        status = rt.status()
        assert status is not None
        moved = {r["file"]: r for r in status.get("quarantined", [])}
        assert set(moved) == {"journal.db", "results.db"}, status.get("quarantined")
        for name, record in moved.items():
            assert record["moved_to"].startswith(f"{name}.corrupt-")
            assert "not a database" in record["reason"]
        aside = home / moved["journal.db"]["moved_to"]
        assert aside.read_bytes() == garbage
        assert (home / moved["results.db"]["moved_to"]).read_bytes() == b"results " * 4096
        for name in ("journal.db", "results.db"):  # fresh, healthy databases in their place
            db = sqlite3.connect(home / name)
            assert db.execute("PRAGMA quick_check").fetchone() == ("ok",)
            db.close()
        assert "journal.db is corrupt" in (home / "logs" / "scheduler.log").read_text()
        assert "results.db is corrupt" in (home / "logs" / "supervisor.log").read_text()

        rt.kill("scheduler")  # a restarted scheduler still reports what this runtime moved
        rt.wait_serving()
        again = rt.status()
        assert again is not None
        assert {r["file"] for r in again.get("quarantined", [])} == {"journal.db",
                                                                     "results.db"}
    finally:
        rt.stop()


def test_an_undecodable_journal_row_is_dead_lettered_and_the_other_jobs_run(
        tmp_path: Path, tiny_model: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    journal = Journal(home / "journal.db")
    journal.write([JAccept(_spec("broken"), at=1.0), JAccept(_spec("kept"), at=2.0)])
    journal.close()
    db = sqlite3.connect(home / "journal.db")
    with db:
        db.execute("UPDATE jobs SET spec = ? WHERE job_id = 'broken'", (b"\xc1not msgpack",))
    db.close()

    rt = _runtime(home)
    rt.start()
    try:
        w = rt.wire()
        assert w.request("attach", job_id="kept")["type"] == "accepted"
        assert w.end("kept")["type"] == "done"
        reply = w.request("attach", job_id="broken")
        assert reply["type"] == "error" and reply["code"] == "not_found"
        assert "unreadable" in reply["message"]  # attach says where it went, and why
        log = (home / "logs" / "scheduler.log").read_text()
        assert "journal row of job 'broken' moved to the dead letters" in log
        status = rt.status() or {}
        assert "quarantined" not in status  # one bad row is not a bad file
        assert status["dead_letters"]["count"] == 1
    finally:
        rt.stop()
    db = sqlite3.connect(home / "journal.db")  # acknowledged: kept, raw bytes and all
    try:
        assert db.execute("SELECT spec FROM dead_letters WHERE job_id = 'broken'"
                          ).fetchall() == [(b"\xc1not msgpack",)]
    finally:
        db.close()
