"""A model load that holds the GIL for longer than the heartbeat rule allows.

Loading Gemma 3's tokenizer holds Python's GIL for seconds of CPU (more on a busy
device), so no thread of the runner can beat; were the runner not to announce its loads,
the supervisor would restart it mid-swap, in a loop. The runner's test hook
(``UNIUN_TEST_LOAD_HOLD_S``, runtime/runner_main.py) holds the GIL that long before every
load, here longer than the 5 s the test config allows (1 s x 5 missed beats): at boot
(the chat model's preload) and on a swap to a second model.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from uniun.runtime.runner_main import LOAD_HOLD_ENV

from .harness import Runtime, chat_job

pytestmark = pytest.mark.integration

HOLD_S = 8.0  # > heartbeat_interval_s * missed_heartbeats of BASE_CONFIG (5 s)


@pytest.fixture
def rt(make_runtime: Callable[..., Runtime], tiny_model_b: str) -> Runtime:
    return make_runtime(env={LOAD_HOLD_ENV: str(HOLD_S)})


def test_a_runner_that_holds_the_gil_while_loading_is_not_restarted(
        rt: Runtime, tiny_model_b: str) -> None:
    w = rt.wire()
    w.submit(chat_job("before-swap"))
    assert w.end("before-swap")["type"] == "done"
    w.submit({"job_id": "on-b", "kind": "gana", "prompt": "other model",
              "model_id": tiny_model_b, "max_new_tokens": 8})  # a swap: another long load
    assert w.end("on-b")["type"] == "done"
    assert rt.status()["loaded_model"] == tiny_model_b
    restarts = json.loads((rt.home / "run" / "supervisor.json").read_text())["restarts"]
    assert restarts["runner"] == 0
    runner_log = (rt.home / "logs" / "runner.log").read_text()
    assert runner_log.count("holding the GIL") == 2  # the hook did hold, at boot and swap
    assert "runner" in (rt.home / "logs" / "supervisor.log").read_text()
    assert "lost" not in (rt.home / "logs" / "scheduler.log").read_text()
