"""The device's power facts steer a real runtime (docs/device.md, "Power and heat").

The scheduler reads a fake sysfs tree (``[device] sysfs_root``): ``status --json`` shows
the ``power`` object from it; on a battery at 15 % a background job waits while a chat
is answered; on the charger the same job runs to its end. An app's pushed facts (a
``lifecycle`` message with ``power``) win over the tree's for the fields they name, and
each change is on the timeline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.wait import wait_for
from uniun.runtime.bench.fake_sysfs import write_power, write_thermal

from .harness import BASE_CONFIG, Runtime, chat_job

pytestmark = pytest.mark.integration


def _cli(rt: Runtime, *args: str) -> str:
    """``uniun-runtime ARGS`` against ``rt``, as a user runs it; its standard output."""
    env = dict(os.environ, UNIUN_HOME=str(rt.home))
    env.pop("UNIUN_CONFIG", None)
    out = subprocess.run([sys.executable, "-m", "uniun.runtime", *args],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    return out.stdout


def _status_json(rt: Runtime) -> dict:
    """``uniun-runtime status --json``."""
    return json.loads(_cli(rt, "status", "--json"))


def test_status_shows_power_from_the_tree_and_a_low_battery_holds_background_work(
        tmp_path, tiny_model: str) -> None:
    sysfs = tmp_path / "sys"
    write_power(sysfs, battery=15, charging=False)
    write_thermal(sysfs, temp_c=45)
    config = BASE_CONFIG + f'\n[device]\nsysfs_root = "{sysfs}"\npower_poll_s = 0.2\n'
    rt = Runtime(tmp_path / "rt", config)
    rt.start()
    try:
        power = wait_for("the power facts in status", lambda: (
            (p := _status_json(rt).get("power")) and p["percent"] == 15.0 and p))
        assert power["on_battery"] is True and power["thermal"] == "nominal"
        assert power["mode"] == "deadline_only" and power["source"] == "sysfs"

        w = rt.wire()
        assert w.submit({"job_id": "bg", "kind": "gana", "prompt": "p",
                         "max_new_tokens": 8})["type"] == "accepted"
        assert w.submit(chat_job("c", max_new_tokens=4))["type"] == "accepted"
        assert w.end("c")["type"] == "done"  # chat is never throttled
        status = rt.status()
        assert status is not None and "bg" in status["queues"]["T4"]  # still waiting

        write_power(sysfs, battery=15, charging=True)
        assert w.end("bg")["type"] == "done"  # on the charger it runs
        assert _status_json(rt)["power"]["mode"] == "normal"

        assert "power: thermal=hot" in _cli(rt, "lifecycle", "--thermal", "hot")
        power = _status_json(rt)["power"]
        assert (power["thermal"], power["mode"], power["source"]) == (
            "hot", "paused", "app+sysfs")
        assert power["on_battery"] is False  # the field the app left out: from sysfs
        details = [e["detail"] for e in rt.status()["events"] if e["what"] == "power"]
        assert any("battery, 15 %" in d for d in details)
        assert "paused: thermal hot" in details
    finally:
        assert rt.stop() == 0
