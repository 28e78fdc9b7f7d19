"""``uniun-runtime top`` frames, rendered from a recorded ``status`` without a terminal.

``data/status_preemption.json`` is a status reply recorded from a real runtime (tiny
model) right after a chat preempted a nataraj job. The frames are compared with the
texts next to it (snapshot tests): a layout change shows up as a readable diff. To
accept a deliberate change, regenerate them with
``UNIUN_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/runtime/test_top.py``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from uniun.runtime.top_view import Rates, down_frame, frame_text

DATA = Path(__file__).parent / "data"
STATUS = json.loads((DATA / "status_preemption.json").read_text())
NOW = STATUS["events"][-1]["at"] + 0.5  # half a second after the preemption
ENDPOINT = "ipc:///home/user/.uniun/run/front.sock"


@pytest.fixture(autouse=True)
def _utc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")  # the header shows the local time of day
    time.tzset()


def snapshot(name: str, text: str) -> None:
    path = DATA / name
    if os.environ.get("UNIUN_UPDATE_SNAPSHOTS") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; see the module docstring"


@pytest.mark.parametrize("width", [100, 72, 44])
def test_a_frame_of_a_recorded_preemption_matches_its_snapshot(width: int) -> None:
    text = frame_text(STATUS, endpoint=ENDPOINT, width=width, now=NOW)
    assert all(len(line) <= width for line in text.splitlines())
    snapshot(f"top_frame_{width}.txt", text)


def test_the_frame_says_what_a_user_looks_for() -> None:
    text = frame_text(STATUS, endpoint=ENDPOINT, width=100, now=NOW)
    for expected in ("running: chat-1 · chat · T0", "T4 fair pool          1   bg-1",
                     "T2 share: 0% of 60% budget", "preempt", "preempted for chat-1",
                     "runner      3635", "model tiny-1", "lifecycle foreground"):
        assert expected in text, expected


def test_the_header_says_what_the_power_governor_does() -> None:
    status = {**STATUS, "power": {"on_battery": True, "percent": 15.0, "thermal": "warm",
                                  "mode": "deadline_only", "reason": "battery 15 % < 20 %"}}
    text = frame_text(status, endpoint=ENDPOINT, width=100, now=NOW)
    assert ("power battery 15 % · warm · background deadline_only (battery 15 % < 20 %)"
            in text)


def test_live_rates_come_from_successive_frames_and_restarts_become_events() -> None:
    rates = Rates()
    first = json.loads(json.dumps(STATUS))
    first["running"]["tokens"] = 10
    rates.update(first, 100.0)
    later = json.loads(json.dumps(first))
    later["running"]["tokens"] = 30
    later["process_info"]["runner"]["restarts"] = 1
    rates.update(later, 100.5)
    assert rates.rate == pytest.approx(40.0)
    text = frame_text(later, endpoint=ENDPOINT, width=100, now=NOW, rates=rates)
    assert "30 tokens · 40.0 tok/s" in text
    assert "restart" in text and "runner (#1)" in text


def test_an_idle_runtime_and_a_missing_field_still_render() -> None:
    bare = {"policy": "fcfs", "runner": {"up": False}}
    text = frame_text(bare, endpoint=ENDPOINT, width=80, now=NOW)
    assert "running: idle" in text and "runner DOWN" in text and "none yet" in text


def test_the_down_frame_says_the_runtime_is_not_answering() -> None:
    text = str(down_frame(ENDPOINT, NOW - 12, "SchedulerUnavailable", NOW))
    assert "runtime not answering for 12 s" in text and "uniun-runtime start" in text
