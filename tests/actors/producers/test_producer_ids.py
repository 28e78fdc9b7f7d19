"""Producer job ids: no other client can take one first, and a restart keeps them
(``actors/producers/ids.py``), against the fake scheduler of ``fakes.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.actors.producers.fakes import FakeClient, stable_id
from uniun.actors.producers import ids
from uniun.actors.producers.deck import WaterMarks
from uniun.actors.producers.extract import ExtractProducer, ExtractSettings
from uniun.actors.producers.gana_cron import GanaCron, GanaSettings
from uniun.actors.producers.lifecycle import LifecycleWatch
from uniun.actors.producers.nataraj import NatarajProducer, NatarajSettings
from uniun.actors.producers.notes import extract_job_prefix, note_hash
from uniun.actors.producers.results import ResultsStore


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[ResultsStore]:
    s = ResultsStore(tmp_path / "results.db")
    yield s
    s.close()


def nataraj(store: ResultsStore, client: FakeClient, high: int = 2) -> NatarajProducer:
    settings = NatarajSettings(marks=WaterMarks(1, high), check_interval_s=1.0)
    return NatarajProducer.with_tracker(settings, store, client)


def finish_all(client: FakeClient, prod: NatarajProducer) -> None:
    for job_id in client.unique_submits():
        if job_id in client.streams and not client.streams[job_id].ended:
            client.finish(job_id, f"Q: {job_id}?\nA: yes")
    assert prod.tracker is not None
    prod.tracker.pump(0.0)


def test_foreign_jobs_under_every_id_a_client_could_compute_do_not_block_the_producers(
        store: ResultsStore, tmp_path: Path) -> None:
    client = FakeClient()
    for n in range(1, 50):  # what `nataraj-<n>` ids a client could take ahead
        client.foreign(f"nataraj-{n}")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# A\nAda met Bob.\n")
    prefix = extract_job_prefix("a.md", note_hash((notes / "a.md").read_bytes()))
    for attempt in range(3):
        client.foreign(f"{prefix}{attempt}")
    ganas = tmp_path / "ganas.toml"
    ganas.write_text('[[gana]]\nid = "g"\nprompt = "hi"\nevery_minutes = 1\n')
    client.foreign("gana-g-1000000")

    prod = nataraj(store, client)
    prod.step(0.0)
    finish_all(client, prod)
    assert store.deck_size() == 2
    extract = ExtractProducer.with_tracker(ExtractSettings(notes_dir=notes), store, client)
    extract.step(0.0)
    settings = GanaSettings(ganas_file=ganas, lead_s=0.0, check_interval_s=1.0)
    cron = GanaCron.with_tracker(settings, store, client,
                                 LifecycleWatch(client.status, poll_s=0.0))
    cron.step(1000.0)
    mine = [j for j in client.unique_submits() if not j.startswith("nataraj")]
    assert [stable_id(j) for j in mine] == [f"{prefix}0", "gana-g-1000000"]
    assert all(store.job(j)["state"] == "submitted" for j in mine)  # accepted, followed


def test_a_foreign_job_on_the_very_id_costs_one_card_and_the_next_id_is_taken(
        store: ResultsStore, monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient()
    tags = iter(["0" * 16, "1" * 16, "2" * 16])  # the first id leaked to another client
    monkeypatch.setattr(ids.secrets, "token_hex", lambda _n: next(tags))
    client.foreign(f"nataraj-1-{'0' * 16}")
    prod = nataraj(store, client, high=1)
    prod.step(0.0)
    [refused] = client.submits
    assert store.job(refused)["state"] == "failed"
    assert "invalid_field" in store.job(refused)["error"]
    for t in range(1, 60):  # it backs off, then asks under the next id
        prod.step(float(t))
        finish_all(client, prod)
    assert client.submits[1:] == [f"nataraj-2-{'1' * 16}"] and store.deck_size() == 1


def test_a_restarted_producer_keeps_the_ids_it_persisted(store: ResultsStore) -> None:
    client = FakeClient()
    nataraj(store, client).step(0.0)
    first = list(client.submits)
    assert len(first) == 2 and len({stable_id(j) for j in first}) == 2
    again = FakeClient()
    again.jobs = client.jobs  # the same scheduler; a new producer process
    nataraj(store, again).step(10.0)
    assert again.submits == [] and sorted(again.attaches) == sorted(first)
