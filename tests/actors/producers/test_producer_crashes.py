"""Killing each producer mid-work loses nothing and doubles nothing.

One runtime with every producer. Each is SIGKILLed while it has work in flight (jobs
acknowledged by the scheduler, a Gana claim open, a background generation running); the
supervisor restarts it, and in the end every note is extracted once, every card job is
asked once, and every claimed Gana slot has exactly one recorded run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.actors.producers.mesh import Mesh, settled_fires
from tests.wait import wait_for
from uniun.actors.producers.results_fires import fires

pytestmark = pytest.mark.integration

CONFIG = """
[embed]
enabled = false

[producers]
extract = true
nataraj = true
gana = true
background_gana = true
samples = false
scan_interval_s = 0.5
backfill_per_s = 4.0
extract_in_flight = 4
extract_max_new_tokens = 300
deck_low = 3
deck_high = 6
card_max_new_tokens = 300
check_interval_s = 0.3
lifecycle_poll_s = 0.3
gana_lead_s = 0
background_lease_s = 3
"""

GANAS = """
[[gana]]
id = "ticker"
prompt = "Report the news."
every_minutes = 0.05
max_new_tokens = 400
"""


def test_killing_each_producer_mid_work_loses_nothing(tmp_path: Path, tiny_model: str) -> None:
    home = tmp_path / "home"
    (home / "notes").mkdir(parents=True)
    for i in range(12):
        (home / "notes" / f"n{i:02d}.md").write_text(f"# Note {i}\nEve {i} met Finn {i}.\n")
    (home / "ganas.toml").write_text(GANAS)
    mesh = Mesh(home, CONFIG).start()
    store = mesh.store()
    try:
        def open_jobs(producer: str) -> bool:
            return bool([j for j in store.open_jobs(producer) if j["state"] == "submitted"])

        wait_for("extract jobs in flight", lambda: open_jobs("extract"), every=0.02)
        mesh.kill("extract")
        wait_for("card jobs in flight", lambda: open_jobs("nataraj"), every=0.02)
        mesh.kill("nataraj")
        wait_for("an open gana-cron fire", lambda: any(
            f["state"] == "claimed" and f["owner"] == "cron" for f in fires(store)), every=0.02)
        mesh.kill("gana")

        mesh.lifecycle("background")
        wait_for("a background fire in progress", lambda: any(
            f["state"] == "claimed" and f["owner"] == "background" for f in fires(store)),
            every=0.02)
        mesh.kill("background-gana")
        wait_for("the background fire taken over and finished", lambda: all(
            f["state"] == "done" for f in fires(store) if f["owner"] == "background")
            and any(r["runner"] == "background" for r in store.gana_runs()), timeout=180)
        mesh.lifecycle("foreground")

        # A result row and its job's 'done' are two commits: wait for both.
        wait_for("every note extracted and its job done", lambda: len(store.list_results(
            "knowledge", limit=1000)) >= 12 and not store.open_jobs("extract"), timeout=300)
        # A kill may land between two of a refill's submissions: the jobs persisted before it
        # must all finish; the deck is then at least at its low mark (hysteresis: a deck
        # at the low mark is not refilled).
        wait_for("every card job finished and the deck at its low mark", lambda: not
                 store.open_jobs("nataraj") and store.deck_size() >= 3, timeout=300)
        wait_for("every claimed fire finished",
                 lambda: all(f["state"] == "done" for f in fires(store)), timeout=180)

        knowledge = store.list_results("knowledge", limit=1000)
        assert sorted(r["note_path"] for r in knowledge) == [f"n{i:02d}.md" for i in range(12)]
        extract_jobs = store.query("SELECT job_id, state FROM producer_jobs "
                                   "WHERE producer='extract'")
        assert len(extract_jobs) == 12  # one job per note: nothing resubmitted under a new id
        assert all(j["state"] == "done" for j in extract_jobs)
        card_jobs = store.query("SELECT job_id, state FROM producer_jobs "
                                "WHERE producer='nataraj'")
        assert card_jobs and all(j["state"] == "done" for j in card_jobs)
        cards = [c[0] for c in store.query("SELECT job_id FROM deck_cards")]
        assert sorted(cards) == sorted(j["job_id"] for j in card_jobs)  # one card per job
        claims, runs = settled_fires(store, "ticker")
        assert sorted(r["job_id"] for r in runs) == sorted(f["job_id"] for f in claims)
        slots = [f["slot"] for f in claims]
        assert len(slots) == len(set(slots))
    finally:
        store.close()
        code = mesh.stop()
        print(mesh.logs())
    assert code == 0
