"""The console's rooms without a runtime: the timeline window, the controls' checks, the
hub's fan-out, the chaos round's rules (over a fake chaos command), and its routes in the
gateway's app (Starlette's test client; a real ``Client`` to an endpoint where nothing
listens, and a real results database written by the producers' own store)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from uniun.actors.gateway import console_control as cc
from uniun.actors.gateway.app import OPEN_PATHS, build_app
from uniun.actors.gateway.console_chaos import ChaosRound
from uniun.actors.gateway.console_feed import TimelineWindow
from uniun.actors.gateway.console_hub import QUEUE_MAX, RESYNC, Hub
from uniun.actors.gateway.console_routes import Console, ConsoleSettings, static_files
from uniun.actors.gateway.errors import ApiError
from uniun.actors.gateway.gateway import Gateway, GatewaySettings
from uniun.actors.producers.results import ResultsStore
from uniun.actors.producers.results_reader import ResultsReader
from uniun.actors.timeline import Mark, Segment

BASE = "http://127.0.0.1:8765"
JSON = {"Content-Type": "application/json"}


# -- the timeline window ----------------------------------------------------------------

def _seg(job: str, start: float, end: float, lane: str = "run") -> Segment:
    return Segment(job, lane, "nataraj", "nataraj", 4, "m", start, end, "preempted", 5)


def test_the_window_keeps_a_record_once_whether_journaled_or_pushed() -> None:
    window = TimelineWindow(60.0)
    journal = [_seg("a", 100.0, 101.0), _seg("a", 99.0, 100.0, "wait")]
    marks = [Mark("preempt", 101.0, "a", "preempted for c")]
    assert window.add(journal, marks) == 3
    pushed = {"job_id": "a", "lane": "run", "kind": "nataraj", "flow": "nataraj", "tier": 4,
              "model_id": "m", "start": 100.0, "end": 101.0, "reason": "preempted",
              "tokens": 5}
    mark = {"what": "preempt", "at": 101.0, "job_id": "a", "detail": "preempted for c"}
    assert window.add([pushed], [mark]) == 0  # the same stretch and instant, seen again
    assert [s["lane"] for s in window.segments()] == ["wait", "run"]
    assert window.marks() == [mark]


def test_the_window_forgets_what_ended_before_it_and_beyond_its_cap() -> None:
    window = TimelineWindow(10.0, max_records=3)
    window.add([_seg(f"j{i}", float(i), i + 0.5) for i in range(20)],
               [Mark("resume", float(i), f"j{i}") for i in range(20)])
    window.trim(now=20.0)
    assert [s["job_id"] for s in window.segments()] == ["j17", "j18", "j19"]
    assert [m["job_id"] for m in window.marks()] == ["j17", "j18", "j19"]


# -- the controls' checks ---------------------------------------------------------------

KINDS = ("chat", "extract", "nataraj", "gana")


def test_a_background_job_is_checked_field_by_field() -> None:
    job = cc.background_job({"kind": "nataraj", "prompt": "p", "max_new_tokens": 9}, KINDS, 100)
    assert job["kind"] == "nataraj" and job["max_new_tokens"] == 9
    assert job["job_id"].startswith("console-nataraj-")
    bad = [({"kind": "chat", "prompt": "p"}, "kind"), ({"kind": "x", "prompt": "p"}, "kind"),
           ({"kind": "gana", "prompt": " "}, "prompt"),
           ({"kind": "gana", "prompt": "p", "max_new_tokens": 101}, "max_new_tokens"),
           ({"kind": "gana", "prompt": "p", "max_new_tokens": True}, "max_new_tokens"),
           ({"kind": "gana", "prompt": "p", "max_new_tokens": 5, "tier": 0}, "tier"),
           (["kind"], None)]
    for body, param in bad:
        with pytest.raises(ApiError) as err:
            cc.background_job(body, KINDS, 100)
        assert err.value.status == 400 and err.value.param == param, body


def test_foreground_lifecycle_and_cancel_bodies() -> None:
    assert cc.foreground_kind({"kind": None}, KINDS) is None
    assert cc.foreground_kind({"kind": "gana"}, KINDS) == "gana"
    assert cc.lifecycle_state({"state": "background"}) == "background"
    assert cc.job_id_of({"job_id": "j-1"}) == "j-1"
    for call in (lambda: cc.foreground_kind({"kind": "dance"}, KINDS),
                 lambda: cc.lifecycle_state({"state": "asleep"}),
                 lambda: cc.job_id_of({"job_id": ""}), lambda: cc.job_id_of({"job_id": 3})):
        with pytest.raises(ApiError):
            call()


# -- the hub ----------------------------------------------------------------------------

def test_a_page_that_does_not_read_is_resynced_not_buffered(tmp_path: Path) -> None:
    async def run() -> None:
        hub = Hub(f"ipc://{tmp_path}/nobody.sock", curve=None, journal=None, results=None,
                  window_s=60.0)
        slow, quick = hub.subscribe("a"), hub.subscribe("b")
        try:
            for i in range(QUEUE_MAX + 5):
                hub.publish({"type": "state", "n": i})
                while not quick.queue.empty():
                    quick.queue.get_nowait()
            assert slow.resyncs >= 1 and quick.resyncs == 0
            assert slow.queue.qsize() < QUEUE_MAX
            assert RESYNC in [slow.queue.get_nowait() for _ in range(slow.queue.qsize())]
        finally:
            hub.close()
    asyncio.run(run())


def test_a_background_job_that_ended_makes_the_hub_look_at_the_results(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    store = ResultsStore(db)

    async def run() -> None:
        hub = Hub(f"ipc://{tmp_path}/nobody.sock", curve=None, journal=None,
                  results=ResultsReader(db), window_s=60.0)
        sub = hub.subscribe("127.0.0.1")
        try:
            first = json.loads((await asyncio.wait_for(sub.queue.get(), 10))[6:])
            assert first["type"] == "results" and first["counts"]["card"] == 0
            store.add_card("nat-1", "topic", "a card")
            hub._on_push({"segments": [{"job_id": "nat-1", "lane": "run", "kind": "nataraj",
                                        "start": 1.0, "end": 2.0, "reason": "done"}]},
                         time.time())
            frames = []
            while not any(f.get("type") == "results" for f in frames):
                frames.append(json.loads((await asyncio.wait_for(sub.queue.get(), 10))[6:]))
            assert frames[0]["type"] == "state"
            assert frames[-1]["counts"]["card"] == 1
        finally:
            hub.close()
    try:
        asyncio.run(run())
    finally:
        store.close()


# -- the chaos round (over a fake chaos command) ----------------------------------------

FAKE_CHAOS = """#!/bin/sh
# A fake of `python -m uniun.runtime chaos ... --out FILE` for the chaos round's rules.
out=""
while [ $# -gt 0 ]; do [ "$1" = "--out" ] && out="$2"; shift; done
echo "calibrating: every template once" >&2
sleep "${FAKE_SLEEP:-0}"
echo '{"ok": true, "faults_injected": 1, "faults_by_kind": {"kill:runner": 1},
       "jobs": {"lost": 0}, "runtime_alive": true}' > "$out"
"""


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    path = tmp_path / "fake-chaos"
    path.write_text(FAKE_CHAOS)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "run").mkdir()
    return str(path)


def test_one_round_at_a_time_and_none_within_the_restart_window(tmp_path: Path,
                                                               fake_python: str) -> None:
    events: list[dict] = []

    async def run() -> None:
        chaos = ChaosRound(tmp_path, publish=events.append, enabled=True, min_gap_s=60.0,
                           python=fake_python)
        os.environ["FAKE_SLEEP"] = "0.3"
        try:
            assert chaos.start()["state"] == "running"
            with pytest.raises(ApiError) as busy:
                chaos.start()
            assert busy.value.status == 409
            while chaos.state == "running":
                await asyncio.sleep(0.05)
            assert chaos.state == "passed" and chaos.verdict["ok"]
            with pytest.raises(ApiError) as soon:
                chaos.start()
            assert soon.value.status == 429 and soon.value.code == "chaos_too_soon"
        finally:
            os.environ.pop("FAKE_SLEEP", None)
    asyncio.run(run())
    lines = [e["line"] for e in events if "line" in e]
    assert lines == ["calibrating: every template once"]
    assert events[-1]["state"] == "passed"


def test_a_round_past_its_time_is_stopped_and_failed(tmp_path: Path, fake_python: str) -> None:
    async def run() -> ChaosRound:
        chaos = ChaosRound(tmp_path, publish=lambda _e: None, enabled=True, timeout_s=0.5,
                           python=fake_python)
        os.environ["FAKE_SLEEP"] = "30"
        try:
            chaos.start()
            while chaos.state == "running":
                await asyncio.sleep(0.05)
        finally:
            os.environ.pop("FAKE_SLEEP", None)
        return chaos
    chaos = asyncio.run(run())
    assert chaos.state == "failed" and "longer than" in (chaos.error or "")


# -- the routes in the gateway's app ----------------------------------------------------

def _app(tmp_path: Path, api_key: str = "", chaos: bool = True) -> tuple[TestClient, Gateway]:
    gateway = Gateway(GatewaySettings(front=f"ipc://{tmp_path}/nobody.sock", embed=None,
                                      embed_model="e", models_root=tmp_path / "models",
                                      api_key=api_key))
    console = Console(gateway, ConsoleSettings(home=tmp_path, chaos=chaos),
                      results=ResultsReader(tmp_path / "results.db"))
    app = build_app(gateway, extra_routes=console.routes(),
                    open_paths=OPEN_PATHS | console.open_paths())
    return TestClient(app, base_url=BASE), gateway


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    http, gateway = _app(tmp_path)
    with http:
        yield http
    gateway.close()


def test_the_page_is_served_with_its_own_origin_only(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["x-frame-options"] == "DENY"
    for name in static_files():
        reply = client.get(f"/console/{name}")
        assert reply.status_code == 200 and reply.content
        again = client.get(f"/console/{name}", headers={"If-None-Match": reply.headers["etag"]})
        assert again.status_code == 304
    assert client.get("/console/main.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/console/nothing.js").status_code == 404
    assert client.get("/console/..%2Fconsole_routes.py").status_code == 404


def test_with_a_key_the_page_is_open_and_its_data_is_not(tmp_path: Path) -> None:
    http, gateway = _app(tmp_path, api_key="s3cret")
    with http:
        assert http.get("/").status_code == 200
        assert http.get("/console/console.css").status_code == 200
        assert http.get("/console/api/results").status_code == 401
        assert http.get("/console/api/events").status_code == 401
        assert http.post("/console/api/chaos", json={}).status_code == 401
        ok = http.get("/console/api/results", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json() == {"kind": "knowledge", "items": []}
    gateway.close()


def test_results_are_read_from_the_producers_store(tmp_path: Path, client: TestClient) -> None:
    with ResultsStore(tmp_path / "results.db") as store:
        store.add_card("nat-1", "the sea", "Salt water covers most of the planet.")
        store.add_knowledge(job_id="ex-1", note_path="moon.md", note_sha="s", model_id="m",
                            raw='{"entities": [], "relations": []}',
                            parsed={"entities": [{"name": "Moon", "type": "thing"}],
                                    "relations": []},
                            parse_error=None, finish_reason="stop", total_s=1.0)
    cards = client.get("/console/api/results", params={"kind": "card"}).json()["items"]
    assert [c["topic"] for c in cards] == ["the sea"]
    knowledge = client.get("/console/api/results").json()["items"]
    assert knowledge[0]["parsed"]["entities"][0]["name"] == "Moon"
    assert client.get("/console/api/results", params={"kind": "chat"}).status_code == 400
    assert client.get("/console/api/results", params={"limit": "0"}).status_code == 400


def test_controls_are_refused_at_the_door_or_by_their_checks(client: TestClient) -> None:
    body = json.dumps({"kind": "nataraj", "prompt": "p"})
    foreign = client.post("/console/api/jobs", content=body,
                          headers={**JSON, "Origin": "http://evil.example"})
    assert foreign.status_code == 403
    plain = client.post("/console/api/jobs", content=body,
                        headers={"Content-Type": "text/plain"})
    assert plain.status_code == 415
    bad = client.post("/console/api/jobs", json={"kind": "chat", "prompt": "p"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "kind"
    assert client.post("/console/api/lifecycle", json={"state": "x"}).status_code == 400
    search = client.post("/console/api/search", json={"query": ""})
    assert search.status_code == 400


def test_the_chaos_round_can_be_turned_off(tmp_path: Path) -> None:
    http, gateway = _app(tmp_path, chaos=False)
    with http:
        assert http.get("/console/api/chaos").json()["enabled"] is False
        reply = http.post("/console/api/chaos", json={})
        assert reply.status_code == 403 and reply.json()["error"]["code"] == "chaos_disabled"
    gateway.close()


def test_search_ranks_the_notes_and_shows_their_knowledge(tmp_path: Path) -> None:
    import numpy as np

    reader = ResultsReader(tmp_path / "results.db")
    assert reader.search(np.ones(3, dtype=np.float32), 2)[0] == []  # no store: no hits
    with ResultsStore(tmp_path / "results.db") as store:
        for path, vector in (("sea.md", [1.0, 0.0, 0.0]), ("moon.md", [0.0, 1.0, 0.0])):
            store.put_note_embedding(path, "s", np.array(vector, dtype=np.float32))
        store.add_knowledge(job_id="ex-1", note_path="moon.md", note_sha="s", model_id="m",
                            raw="{}", parsed={"entities": [{"name": "Moon"}], "relations": []},
                            parse_error=None)
    hits, reason = reader.search(np.array([0.1, 0.9, 0.0], dtype=np.float32), 2)
    assert reason is None and [h["note_path"] for h in hits] == ["moon.md", "sea.md"]
    assert hits[0]["knowledge"]["entities"] == [{"name": "Moon"}] and hits[1]["knowledge"] is None
    assert reader.search(np.ones(4, dtype=np.float32), 2)[1]  # another model's size: why
