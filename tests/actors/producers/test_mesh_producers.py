"""End to end: a newcomer's first run with every producer, and the producer commands.

One runtime (supervisor, scheduler, runner, embedding pool, extract, nataraj, gana-cron,
background-Gana; tiny decoder, all-MiniLM-L6-v2 embedder) over a fresh home, so the
sample notes and Ganas are written on first start.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.actors.producers.fakes import stable_id
from tests.actors.producers.mesh import Mesh
from tests.wait import wait_for

pytestmark = pytest.mark.integration

CONFIG = """
[producers]
extract = true
nataraj = true
gana = true
background_gana = true
scan_interval_s = 0.5
backfill_per_s = 5.0
check_interval_s = 0.5
lifecycle_poll_s = 0.5
deck_low = 2
deck_high = 4
extract_max_new_tokens = 48
card_max_new_tokens = 24
gana_lead_s = 0

[embed]
enabled = true
workers = 1
"""


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Iterator[Mesh]:
    rt = Mesh(tmp_path_factory.mktemp("mesh"), CONFIG).start()
    try:
        yield rt
    finally:
        code = rt.stop()
        print(rt.logs())
        assert code == 0, f"the runtime did not stop cleanly (exit {code})"


def _knowledge_by_note(mesh: Mesh) -> dict[str, list[dict]]:
    with mesh.store() as store:
        out: dict[str, list[dict]] = {}
        for row in store.list_results("knowledge", limit=1000):
            out.setdefault(row["note_path"], []).append(row)
        return out


def _open_jobs(mesh: Mesh, producer: str) -> list[dict]:
    with mesh.store() as store:
        return store.open_jobs(producer)


def test_first_run_writes_samples_and_extracts_every_note_once(mesh: Mesh) -> None:
    folder = mesh.home / "notes"  # written by the extract process once it starts
    wait_for("the sample notes", lambda: folder.is_dir() and len(list(folder.iterdir())) == 5)
    notes = sorted(p.name for p in folder.iterdir())
    assert (mesh.home / "ganas.toml").exists()
    # A result row and its job's 'done' are two commits: wait for both.
    wait_for("every sample note extracted and its job done", lambda: len(
        _knowledge_by_note(mesh)) == 5 and not _open_jobs(mesh, "extract"))
    by_note = _knowledge_by_note(mesh)
    assert sorted(by_note) == notes
    for rows in by_note.values():
        assert len(rows) == 1
        (row,) = rows
        assert row["raw"]  # the model's text is kept whatever it is
        assert (row["parsed"] is None) != (row["parse_error"] is None)
    with mesh.store() as store:
        jobs = store.query("SELECT job_id, state FROM producer_jobs WHERE producer='extract'")
    assert len(jobs) == 5  # one job per note: none resent under a new attempt
    assert all(stable_id(j["job_id"]).endswith("-0") and j["state"] == "done" for j in jobs)


def test_deck_fills_to_the_high_mark_and_refills_after_reading(mesh: Mesh) -> None:
    with mesh.store() as store:
        wait_for("a full deck", lambda: store.deck_size() == 4)
        taken = mesh.cli("deck", "--take", "3", "--json")
        assert taken.returncode == 0, taken.stderr
        cards = [json.loads(line) for line in taken.stdout.splitlines()]
        assert len(cards) == 3 and all(c["text"] for c in cards)
        wait_for("the deck refilled", lambda: store.deck_size() == 4)
        ids = [r[0] for r in store.query("SELECT job_id FROM deck_cards")]
        jobs = store.query("SELECT count(*) FROM producer_jobs WHERE producer='nataraj'")[0][0]
    assert len(ids) == len(set(ids)) == 7 and jobs == 7  # no card job asked twice


def test_sample_ganas_fire_through_the_scheduler_with_deadline_and_flow(mesh: Mesh) -> None:
    with mesh.store() as store:
        wait_for("both sample Ganas run", lambda: len(store.gana_runs()) >= 2)
        runs = {r["gana_id"]: r for r in store.gana_runs() if r["slot"] is not None}
        assert set(runs) == {"daily-tip", "word-of-the-day"}
        for gana_id, run in runs.items():
            assert run["runner"] == "scheduler" and run["finish_reason"] in ("stop", "length")
            job = store.job(run["job_id"])["job"]
            assert (job["kind"], job["flow"], job["deadline"]) == ("gana", gana_id, run["slot"])


def test_open_note_runs_a_hinted_extraction_and_restores_the_foreground(mesh: Mesh) -> None:
    wait_for("the sample notes extracted", lambda: len(_knowledge_by_note(mesh)) == 5)
    out = mesh.cli("open-note", "ada-lovelace.md", "--again")
    assert out.returncode == 0, out.stderr
    assert "entities:" in out.stdout or "not usable JSON" in out.stderr
    with mesh.store() as store:
        (row,) = [dict(r) for r in store.query(
            "SELECT job_id, job, state FROM producer_jobs WHERE producer='open-note'")]
        job = json.loads(row["job"])
        assert job["foreground_hint"] is True and job["kind"] == "extract"
        assert row["state"] == "done"
    assert len(_knowledge_by_note(mesh)["ada-lovelace.md"]) == 2
    assert mesh.status()["foreground"] is None
    again = mesh.cli("open-note", "ada-lovelace.md")  # already extracted: shown from the store
    assert again.returncode == 0 and len(_knowledge_by_note(mesh)["ada-lovelace.md"]) == 2


@pytest.fixture
def foreground_reset(mesh: Mesh) -> Iterator[None]:
    """Whatever a test does to the foreground, the next test finds none set."""
    yield
    w = mesh.wire()
    assert w.request("foreground", kind=None)["type"] == "ok"


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_deck_watch_holds_foreground_nataraj_until_ctrl_c(
        mesh: Mesh, foreground_reset: None, inherited: str) -> None:
    # "ignored": started as a background job of a non-interactive shell (bin/test &, CI)
    # is, which inherits SIGINT ignored; Ctrl-C must still close the page.
    watch = subprocess.Popen([sys.executable, "-m", "uniun.runtime", "deck", "--watch",
                              "--pace", "0"], env=mesh.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             preexec_fn=_ignore_sigint if inherited == "ignored" else None)
    try:
        wait_for("foreground nataraj", lambda: mesh.status()["foreground"] == "nataraj")
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=60) == 0
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert mesh.status()["foreground"] is None
    assert "foreground restored" in watch.stderr.read()


def test_gana_run_streams_and_records_an_unscheduled_run(mesh: Mesh) -> None:
    out = mesh.cli("gana", "run", "daily-tip")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    with mesh.store() as store:
        manual = [r for r in store.gana_runs("daily-tip") if r["slot"] is None]
    assert len(manual) == 1 and manual[0]["text"].strip() == out.stdout.strip()
    assert mesh.status()["foreground"] is None


def test_chat_history_is_stored(mesh: Mesh) -> None:
    chat = subprocess.run([sys.executable, "-m", "uniun.runtime", "chat", "--max-new-tokens",
                           "8"], input="hello there\n", env=mesh.env, capture_output=True,
                          text=True, timeout=120)
    assert chat.returncode == 0, chat.stderr
    out = mesh.cli("results", "--kind", "chat", "--json")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert {(r["role"], r["content"] == "hello there") for r in rows} >= {("user", True)}
    assert any(r["role"] == "assistant" for r in rows)


def test_results_lists_every_kind_as_json(mesh: Mesh) -> None:
    out = mesh.cli("results", "--json", "--limit", "1000")
    assert out.returncode == 0, out.stderr
    kinds = {json.loads(line)["kind"] for line in out.stdout.splitlines()}
    assert {"knowledge", "card", "gana"} <= kinds


def test_bad_input_gets_a_clear_error_and_changes_nothing(mesh: Mesh, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.md"
    outside.write_text("# not a note of ours\n")
    with mesh.store() as store:
        before = store.query("SELECT count(*) FROM producer_jobs WHERE producer='open-note'")
    for args, needle in [(("open-note", str(outside)), "not in the notes folder"),
                         (("open-note", "missing.md"), "no such note"),
                         (("gana", "run", "nope"), "no Gana 'nope'"),
                         (("deck", "--take", "-1"), "must not be negative")]:
        out = mesh.cli(*args)
        assert out.returncode == 2 and needle in out.stderr, (args, out.stderr)
    with mesh.store() as store:
        after = store.query("SELECT count(*) FROM producer_jobs WHERE producer='open-note'")
    assert after[0][0] == before[0][0]


def test_notes_are_embedded_and_search_finds_them_by_meaning(mesh: Mesh) -> None:
    with mesh.store() as store:
        wait_for("every sample note embedded", lambda: len(store.note_embeddings()[0]) == 5)
        _paths, matrix = store.note_embeddings()
    assert matrix.shape == (5, 384)
    for query, expected in [("Charles Babbage and the first computer program",
                             "ada-lovelace.md"),
                            ("tram rides and pastries in Portugal", "trip-to-lisbon.md"),
                            ("when to water the tomatoes", "garden.txt")]:
        out = mesh.cli("search", query, "-k", "2", "--json")
        assert out.returncode == 0, out.stderr
        hits = [json.loads(line) for line in out.stdout.splitlines()]
        assert hits[0]["note_path"] == expected, (query, hits)
        assert hits[0]["score"] > hits[1]["score"]
