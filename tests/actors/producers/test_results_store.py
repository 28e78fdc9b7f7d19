"""The results database: migrations, WAL, and what each producer stores."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from uniun.actors.producers.results import ResultsStore, SchemaTooNew
from uniun.actors.producers.results_schema import MIGRATIONS, SCHEMA_VERSION


def test_fresh_database_is_at_the_latest_version_in_wal_mode(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "r.db") as store:
        assert store.schema_version() == SCHEMA_VERSION
        mode = store.query("PRAGMA journal_mode")[0][0]
        assert mode == "wal"


def test_a_version_1_database_keeps_its_results_when_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[0])
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO deck_cards (job_id, topic, text, created) VALUES"
                 " ('nataraj-1', 'bees', 'Q: how? A: dance', 1.0)")
    conn.commit()
    conn.close()

    with ResultsStore(path) as store:
        assert store.schema_version() == SCHEMA_VERSION
        assert [c["text"] for c in store.deck()] == ["Q: how? A: dance"]
        # The tables of version 2 exist and work.
        assert store.record_job("x-1", "nataraj", {"job_id": "x-1"}, {"topic": "t"})
        assert store.open_jobs("nataraj")[0]["meta"] == {"topic": "t"}


def test_reopening_does_not_migrate_twice(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    ResultsStore(path).close()
    with ResultsStore(path) as store:
        store.add_card("nataraj-1", None, "a card")
    with ResultsStore(path) as store:
        assert store.schema_version() == SCHEMA_VERSION
        assert store.deck_size() == 1


def test_a_database_from_a_newer_runtime_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(SchemaTooNew, match="newer"):
        ResultsStore(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0


def test_knowledge_keeps_raw_text_and_parse_failures(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "r.db") as store:
        store.add_knowledge(job_id="e1", note_path="a.md", note_sha="s1", model_id="tiny-1",
                            raw="not json at all", parsed=None,
                            parse_error="no JSON object in the answer")
        store.add_knowledge(job_id="e2", note_path="b.md", note_sha="s2", model_id="tiny-1",
                            raw='{"entities": []}', parsed={"entities": [], "relations": []},
                            parse_error=None)
        rows = {r["job_id"]: r for r in store.list_results("knowledge")}
        assert rows["e1"]["raw"] == "not json at all"
        assert rows["e1"]["parsed"] is None and "no JSON" in rows["e1"]["parse_error"]
        assert rows["e2"]["parsed"] == {"entities": [], "relations": []}


def test_note_embeddings_round_trip_as_float32(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "r.db") as store:
        v = np.arange(4, dtype=np.float32) / 7
        store.put_note_embedding("n/a.md", "sha-a", v, "all-minilm-l6-v2")
        store.put_note_embedding("n/b.md", "sha-b", -v)
        store.put_note_embedding("n/a.md", "sha-a2", v * 2)  # a changed note replaces
        paths, matrix = store.note_embeddings()
        assert paths == ["n/a.md", "n/b.md"]
        assert matrix.dtype == np.float32 and matrix.shape == (2, 4)
        np.testing.assert_array_equal(matrix[0], v * 2)
        assert store.embedded_sha("n/a.md") == "sha-a2"


def test_deck_take_removes_cards_oldest_first_and_duplicates_are_ignored(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "r.db") as store:
        assert store.add_card("n-1", "t", "first")
        assert store.add_card("n-2", "t", "second")
        assert not store.add_card("n-1", "t", "first again")  # a re-delivered done
        assert [c["text"] for c in store.take_cards(1)] == ["first"]
        assert [c["text"] for c in store.deck()] == ["second"]


def test_results_listing_filters_by_kind_and_rejects_unknown_kinds(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "r.db") as store:
        store.add_card("n-1", "t", "card")
        store.add_chat_message("c1", "user", "hello")
        store.add_gana_run(job_id="g-1", gana_id="g", slot=1.0, runner="scheduler",
                           model_id="tiny-1", prompt="p", text="out", finish_reason="length",
                           total_s=0.5)
        assert {r["kind"] for r in store.list_results()} == {"card", "chat", "gana"}
        assert [r["kind"] for r in store.list_results("gana")] == ["gana"]
        with pytest.raises(ValueError, match="unknown result kind"):
            store.list_results("cards")
        with pytest.raises(ValueError, match="unknown gana run field"):
            store.add_gana_run(job_id="g-2", gana_id="g", runner="x", prompt="p", text="",
                               finish_reason=None, colour="red")


def test_two_connections_see_each_others_commits(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    with ResultsStore(path) as a, ResultsStore(path) as b:
        a.add_card("n-1", None, "from a")
        assert b.deck_size() == 1


def test_an_open_note_job_whose_command_was_killed_is_adopted_at_once(tmp_path) -> None:
    import subprocess
    import sys

    from uniun.actors.producers.owners import owner_gone, owner_stamp

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a command that has exited (reaped: its pid names nobody now)
    dead = {"owner_pid": gone.pid, "owner_start": 1}
    with ResultsStore(tmp_path / "r.db") as store:
        for job_id, meta in (("killed", dead), ("running", owner_stamp()), ("old", {})):
            store.supersede_jobs(job_id, "open-note",
                                 lambda n, j=job_id, m=meta: ({"job_id": j, "kind": "extract"},
                                                              m))
        adopted = store.adopt_jobs("open-note", "extract", 600.0, owner_gone=owner_gone)
        assert adopted == 1
        assert [j["job_id"] for j in store.open_jobs("extract")] == ["killed"]
        assert sorted(j["job_id"] for j in store.open_jobs("open-note")) == ["old", "running"]


def test_an_unreadable_producer_job_row_is_skipped_not_fatal(tmp_path: Path) -> None:
    """A damaged row must not keep a producer from starting: it is logged with its job id,
    marked failed and left out; the other open jobs come back; listings show raw text."""
    from loguru import logger

    path = tmp_path / "r.db"
    with ResultsStore(path) as store:
        for job_id in ("x-1", "x-2", "x-3"):
            assert store.record_job(job_id, "nataraj", {"job_id": job_id}, {"topic": "t"})
        store.add_chat_message("c", "user", "hi", timings={"total_s": 1.0})
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE producer_jobs SET job = '{not json' WHERE job_id = 'x-2'")
        db.execute("UPDATE producer_jobs SET meta = '[1, 2]' WHERE job_id = 'x-3'")
        db.execute("UPDATE chat_messages SET timings = 'garbage'")
    db.close()
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(f"{m.record['extra'].get('job')} {m}"),
                      level="ERROR")
    try:
        with ResultsStore(path) as store:
            assert [j["job_id"] for j in store.open_jobs("nataraj")] == ["x-1"]
            assert store.open_jobs("nataraj") == store.open_jobs("nataraj")  # quiet now
            assert store.job("x-2") is None
            assert [r["timings"] for r in store.list_results("chat")] == ["garbage"]
    finally:
        logger.remove(sink)
    for job_id in ("x-2", "x-3"):
        assert any(line.startswith(f"{job_id} ") and "unreadable, skipped" in line
                   for line in lines), lines
