"""The producers' logic against a fake scheduler: what gets submitted, stored, re-attached."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.actors.producers.fakes import FakeClient, stable_id
from uniun.actors.producers.deck import WaterMarks
from uniun.actors.producers.extract import ExtractProducer, ExtractSettings
from uniun.actors.producers.gana_cron import GanaCron, GanaSettings
from uniun.actors.producers.lifecycle import LifecycleWatch
from uniun.actors.producers.nataraj import NatarajProducer, NatarajSettings
from uniun.actors.producers.results import ResultsStore
from uniun.actors.producers.results_fires import fires


@pytest.fixture()
def store(tmp_path: Path) -> ResultsStore:
    s = ResultsStore(tmp_path / "results.db")
    yield s
    s.close()


def _extract(store: ResultsStore, client: FakeClient, notes: Path, **kw) -> ExtractProducer:
    settings = ExtractSettings(notes_dir=notes, scan_interval_s=1.0, **kw)
    return ExtractProducer.with_tracker(settings, store, client, now=0.0)


def _write_notes(folder: Path, n: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"note-{i:02d}.md").write_text(f"# Note {i}\nAda met Bob in city {i}.\n")


def test_backfill_is_paced_and_capped(store: ResultsStore, tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    _write_notes(notes, 10)
    client = FakeClient()
    prod = _extract(store, client, notes, backfill_per_s=0.5, max_in_flight=3)
    for t in range(0, 5):  # five seconds at 0.5 notes/s: at most 3 (bucket of 1 + 2)
        prod.step(float(t))
    assert 2 <= len(client.submits) <= 3
    for t in range(5, 30):
        prod.step(float(t))
    assert len(client.submits) == 3  # capped by max_in_flight while none finished
    for job_id in client.submits:
        client.finish(job_id, '{"entities": [{"name": "Ada"}], "relations": []}')
    prod.tracker.pump(0.0)
    for t in range(30, 40):
        prod.step(float(t))
    assert len(client.submits) == 6 and len(set(client.submits)) == 6


def test_a_note_written_while_running_skips_the_backfill_queue(store: ResultsStore,
                                                               tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    _write_notes(notes, 5)
    client = FakeClient()
    prod = _extract(store, client, notes, backfill_per_s=0.01)
    prod.step(0.0)
    assert len(client.submits) == 1  # the backfill's first token
    (notes / "fresh.md").write_text("# Fresh\nCarla visits Dakar.\n")
    prod.step(1.0)
    fresh = [j for j in client.submits if "Dakar" in client.jobs[j]["messages"][-1]["content"]]
    assert len(fresh) == 1 and len(client.submits) == 2
    assert client.jobs[fresh[0]]["kind"] == "extract"
    assert client.jobs[fresh[0]]["foreground_hint"] is False
    assert client.jobs[fresh[0]]["stream"] is False


def test_results_are_stored_raw_and_parsed_and_failures_recorded(store: ResultsStore,
                                                                 tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    _write_notes(notes, 2)
    client = FakeClient()
    prod = _extract(store, client, notes, backfill_per_s=10)
    prod.step(0.0)
    prod.step(1.0)
    good, bad = client.submits
    client.finish(good, 'Here: {"entities": [{"name": "Ada", "type": "person"}], '
                        '"relations": [["Ada", "met", "Bob"]]}')
    client.finish(bad, "I cannot do that.")
    prod.tracker.pump(0.0)
    rows = {r["job_id"]: r for r in store.list_results("knowledge")}
    assert rows[good]["parsed"]["relations"] == [{"source": "Ada", "relation": "met",
                                                   "target": "Bob"}]
    assert rows[bad]["parsed"] is None and rows[bad]["raw"] == "I cannot do that."
    assert rows[bad]["parse_error"]
    prod.step(2.0)
    prod.step(3.0)
    assert len(client.submits) == 2  # both notes are done, parse failure included


def test_a_restarted_producer_reattaches_and_submits_nothing_twice(store: ResultsStore,
                                                                   tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    _write_notes(notes, 4)
    client = FakeClient()
    prod = _extract(store, client, notes, backfill_per_s=10)
    for t in range(4):
        prod.step(float(t))
    first = list(client.submits)
    assert len(first) == 4
    # The process dies; a new one starts on the same database and the same scheduler.
    client2 = FakeClient()
    client2.jobs = client.jobs
    prod2 = _extract(store, client2, notes, backfill_per_s=10)
    for t in range(10, 20):
        prod2.step(float(t))
    assert client2.submits == [] and sorted(client2.attaches) == sorted(first)
    for job_id in first:
        client2.finish(job_id, '{"entities": []}')
    prod2.tracker.pump(0.0)
    assert len(store.list_results("knowledge")) == 4


def test_killed_between_persist_and_submit_the_job_is_submitted_on_restart(
        store: ResultsStore, tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    _write_notes(notes, 1)
    client = FakeClient()
    client.down = True  # persisted, never acknowledged
    prod = _extract(store, client, notes)
    prod.step(0.0)
    assert client.submits == [] and len(store.open_jobs("extract")) == 1
    client.down = False
    prod2 = _extract(store, client, notes)
    prod2.step(100.0)
    assert len(client.submits) == 1


def test_failed_extractions_are_retried_a_bounded_number_of_times(store: ResultsStore,
                                                                  tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    _write_notes(notes, 1)
    client = FakeClient()
    prod = _extract(store, client, notes, backfill_per_s=10, max_attempts=2)
    for t in range(10):
        prod.step(float(t))
        for job_id in list(client.streams):
            if not client.streams[job_id].ended and not client.streams[job_id].queue:
                client.fail(job_id, "internal")
        prod.tracker.pump(0.0)
    assert [stable_id(j)[-1] for j in client.unique_submits()] == ["0", "1"]


def test_embeddings_follow_note_changes_and_deletions(store: ResultsStore, tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    _write_notes(notes, 2)
    calls: list[list[str]] = []

    def embed(texts: list[str]) -> np.ndarray:
        calls.append(texts)
        return np.ones((len(texts), 4), np.float32) / 2

    prod = ExtractProducer(ExtractSettings(notes_dir=notes, scan_interval_s=1.0), store, None,
                           embed=embed)
    prod.step(0.0)
    assert len(calls[0]) == 2 and store.note_embeddings()[0] == ["note-00.md", "note-01.md"]
    prod.step(1.0)
    assert len(calls) == 1  # unchanged notes are not embedded again
    (notes / "note-01.md").write_text("changed")
    (notes / "note-00.md").unlink()
    prod.step(2.0)
    assert calls[-1] == ["changed"] and store.note_embeddings()[0] == ["note-01.md"]


def test_nataraj_fills_to_high_and_refills_below_low(store: ResultsStore) -> None:
    client = FakeClient()
    settings = NatarajSettings(marks=WaterMarks(2, 4), check_interval_s=1.0)
    prod = NatarajProducer.with_tracker(settings, store, client)
    prod.step(0.0)
    assert [stable_id(j) for j in client.submits] == [f"nataraj-{n}" for n in range(1, 5)]
    for job_id in client.submits:
        client.finish(job_id, f"Q: {job_id}?\nA: yes")
    prod.tracker.pump(0.0)
    prod.step(1.0)
    assert store.deck_size() == 4 and len(client.submits) == 4
    store.take_cards(3)
    prod.step(2.0)
    assert [stable_id(j) for j in client.submits[4:]] == ["nataraj-5", "nataraj-6", "nataraj-7"]
    topics = {client.jobs[j]["messages"][1]["content"] for j in client.submits}
    assert len(topics) == 7  # topics rotate


def test_nataraj_gives_a_base_model_a_few_shot_completion_prompt(store: ResultsStore) -> None:
    client = FakeClient()
    settings = NatarajSettings(marks=WaterMarks(1, 1), check_interval_s=1.0,
                               model_id="gemma3-270m", prompt_style="completion")
    prod = NatarajProducer.with_tracker(settings, store, client)
    prod.step(0.0)
    [job_id] = client.submits
    job = client.jobs[job_id]
    assert "messages" not in job and job["model_id"] == "gemma3-270m"
    assert job["prompt"].startswith("Flashcards.") and job["prompt"].endswith("\nQ:")
    assert "\n\n" in job["stop"]
    client.finish(job_id, " What is a pulsar?\nA: A spinning neutron star.")
    prod.tracker.pump(0.0)
    assert store.take_cards(1)[0]["text"] == "Q: What is a pulsar?\nA: A spinning neutron star."


def _cron(store: ResultsStore, client: FakeClient, ganas: Path, lead: float = 0.0) -> GanaCron:
    settings = GanaSettings(ganas_file=ganas, lead_s=lead, check_interval_s=1.0)
    watch = LifecycleWatch(client.status, poll_s=0.0)
    return GanaCron.with_tracker(settings, store, client, watch)


def test_gana_cron_fires_on_schedule_with_deadline_and_flow(store: ResultsStore,
                                                            tmp_path: Path) -> None:
    ganas = tmp_path / "ganas.toml"
    ganas.write_text('[[gana]]\nid = "a"\nprompt = "hi"\nevery_minutes = 1\n'
                     '[[gana]]\nid = "b"\nprompt = "yo"\nevery_minutes = 2\n')
    client = FakeClient()
    cron = _cron(store, client, ganas)
    for t in range(1000, 1250):
        cron.step(float(t))
    by_gana: dict[str, list[float]] = {}
    for job_id in client.submits:
        job = client.jobs[job_id]
        assert job["kind"] == "gana" and job["flow"] in ("a", "b")
        by_gana.setdefault(job["flow"], []).append(job["deadline"])
    assert by_gana["a"] == [1000.0, 1060.0, 1120.0, 1180.0, 1240.0]
    assert by_gana["b"] == [1000.0, 1120.0, 1240.0]


def test_gana_cron_holds_fire_in_background_and_catches_up_once(store: ResultsStore,
                                                                tmp_path: Path) -> None:
    ganas = tmp_path / "ganas.toml"
    ganas.write_text('[[gana]]\nid = "a"\nprompt = "hi"\nevery_minutes = 1\n')
    client = FakeClient()
    cron = _cron(store, client, ganas)
    cron.step(0.0)
    client.lifecycle = "background"
    for t in range(1, 400):
        cron.step(float(t))
    assert len(client.submits) == 1
    client.lifecycle = "foreground"
    cron.step(400.0)
    assert [client.jobs[j]["deadline"] for j in client.submits] == [0.0, 360.0]
    for job_id in client.submits:
        client.finish(job_id, "tip", model_id="tiny-1")
    cron.tracker.pump(0.0)
    assert [f["state"] for f in fires(store)] == ["done", "done"]
    runs = store.gana_runs("a")
    assert [r["runner"] for r in runs] == ["scheduler", "scheduler"]
    assert runs[0]["total_s"] == 0.5 and runs[0]["finish_reason"] == "stop"


def test_a_broken_ganas_toml_keeps_the_previous_ganas(store: ResultsStore,
                                                      tmp_path: Path) -> None:
    ganas = tmp_path / "ganas.toml"
    ganas.write_text('[[gana]]\nid = "a"\nprompt = "hi"\nevery_minutes = 1\n')
    client = FakeClient()
    cron = _cron(store, client, ganas)
    cron.step(0.0)
    ganas.write_text('[[gana]]\nid = "a"\nprompt = "hi"\nevery_minutes = -1\nxx\n')
    cron.step(60.0)
    assert len(client.submits) == 2


def test_background_gana_fires_nothing_while_the_power_governor_holds_background_work(
        store: ResultsStore, tmp_path: Path) -> None:
    from uniun.actors.producers.background_gana import (
        BackgroundGana,
        BackgroundSettings,
        SessionCache,
    )

    ganas = tmp_path / "ganas.toml"
    ganas.write_text('[[gana]]\nid = "a"\nprompt = "hi"\nevery_minutes = 1\n')
    loads: list[str] = []

    def fake_loader(_store: object, model_id: str, _threads: int) -> object:
        loads.append(model_id)
        raise RuntimeError("a fake loader: the test only asks whether a fire started")

    reply = {"lifecycle": "background", "power": {"mode": "paused"}}
    watch = LifecycleWatch(lambda: reply, poll_s=0.0)
    sessions = SessionCache(None, loader=fake_loader)  # type: ignore[arg-type]
    bg = BackgroundGana(BackgroundSettings(ganas_file=ganas, default_model="m"), store,
                        watch, sessions, now=1000.0)
    for t in range(1000, 1200):
        bg.step(float(t))
    assert watch.power_mode == "paused" and loads == [] and fires(store) == []
    reply["power"] = {"mode": "normal"}
    bg.step(1200.0)  # the due slot fires once the heat is gone (the fake load fails it)
    assert loads == ["m"] and len(fires(store)) == 1
