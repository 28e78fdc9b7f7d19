"""Poison jobs end to end: a job that kills every runner it runs on is dead-lettered.

The runner's test fault hook (``UNIUN_TEST_CRASH_MARKER``, runtime/runner_main.py) makes
a job whose input contains the marker SIGKILL the runner as it starts, as a crash in
native code would. Without poison handling the job would be resumed on every new runner
until the supervisor's restart limit stopped the whole runtime.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable

import pytest

from uniun.runtime.runner_main import CRASH_MARKER_ENV

from .harness import Runtime, chat_job, long_job, wait_for

pytestmark = pytest.mark.integration

MARKER = "POISON-7f3a"


@pytest.fixture
def rt(make_runtime: Callable[..., Runtime]) -> Runtime:
    return make_runtime(env={CRASH_MARKER_ENV: MARKER})


def supervisor_restarts(rt: Runtime) -> dict[str, int]:
    return json.loads((rt.home / "run" / "supervisor.json").read_text())["restarts"]


def test_a_job_that_kills_the_runner_three_times_is_poisoned_and_the_runtime_serves_on(
        rt: Runtime) -> None:
    w = rt.wire()
    assert w.submit(long_job("poison", "extract", prompt=f"hello {MARKER}"))["type"] == \
        "accepted"
    end = w.end("poison")
    assert end["type"] == "error" and end["code"] == "poisoned", end
    assert end["retryable"] is False
    assert [e["type"] for e in w.events("poison")].count("error") == 1
    rt.wait_serving()
    assert supervisor_restarts(rt)["runner"] == 3  # charged for the 3 deaths, no more
    w.submit(chat_job("after-poison"))  # the runtime serves on
    assert w.end("after-poison")["type"] == "done"
    assert [p["job_id"] for p in rt.status()["poisoned"]] == ["poison"]

    rt.kill("scheduler", signal.SIGKILL)  # journaled: a new scheduler still knows
    listed = wait_for("the new scheduler to list the poisoned job", lambda: (
        (rt.status(timeout=2.0) or {}).get("poisoned")))
    assert [p["job_id"] for p in listed] == ["poison"]
    assert supervisor_restarts(rt)["runner"] == 3
