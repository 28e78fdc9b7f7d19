"""A request that kills the scheduler costs 2 restarts, not the runtime.

The scheduler's test fault hook (``UNIUN_TEST_VALIDATE_CRASH``, runtime/scheduler_main.py)
makes a submit whose schema contains the text SIGKILL the scheduler while the front
validates it, as a stack overflow in native code would. The library's client re-sends it
once after the first death and gives it up after the second; a client that sends it
again anyway (a raw socket, another job id) is answered ``poisoned`` by the scheduler
from its crash marker, without a third death. Without both the runtime would crash-loop
into the supervisor's restart limit.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from typing import Any

import pytest

from uniun.protocol.client import Client, ClientError
from uniun.runtime.scheduler_main import VALIDATE_CRASH_ENV

from .harness import WAIT_S, Runtime, chat_job, wait_for

pytestmark = pytest.mark.integration

CRASH = "VALIDATE-CRASH-5e1d"


def crashing_job(job_id: str) -> dict[str, Any]:
    schema = {"type": "object", "description": CRASH}
    return chat_job(job_id, format={"type": "json_schema", "schema": schema})


def restarts(rt: Runtime) -> dict[str, int]:
    return json.loads((rt.home / "run" / "supervisor.json").read_text())["restarts"]


@pytest.fixture
def rt(make_runtime: Callable[..., Runtime]) -> Runtime:
    return make_runtime(env={VALIDATE_CRASH_ENV: CRASH})


def test_a_request_that_kills_the_scheduler_costs_two_restarts_and_is_refused_after(
        rt: Runtime) -> None:
    with Client(rt.endpoint, timeout=WAIT_S, reconnect_timeout=WAIT_S) as client:
        with pytest.raises(ClientError) as err:
            client.submit(crashing_job("crash-1"))
        assert err.value.code == "poisoned" and err.value.retryable is False
        assert client.reconnects == 2
    wait_for("the third scheduler", lambda: restarts(rt).get("scheduler") == 2 and rt.status())
    scheduler = rt.pid("scheduler")

    w = rt.wire()  # a client that sends it again anyway, under another id
    reply = w.submit(crashing_job("crash-2"))
    assert (reply["type"], reply["code"], reply["retryable"]) == ("error", "poisoned", False)
    assert reply["job_id"] == "crash-2"
    w.submit(chat_job("after"))  # the runtime serves on, with the same scheduler
    assert w.end("after")["type"] == "done"
    assert rt.pid("scheduler") == scheduler
    assert restarts(rt) == {"scheduler": 2, "runner": 0}  # 3 of the 5 in 60 s left

    marker = rt.home / "run" / "crash-marker"
    assert stat.S_IMODE(os.stat(marker).st_mode) == 0o600
    table = marker.read_text().splitlines()[2:]
    assert len(table) == 1 and table[0].split()[1] == "2"
