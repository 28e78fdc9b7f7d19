"""The whole device obeys the foreground (docs/device.md), seen from outside a real runtime.

Scheduler, runner and embedding pool are the product's processes. While a chat
generates, an embedding request sent to the pool is accepted and waits; it is answered
after the chat ends, never refused. ``status`` reports that the runtime is ready and each
process's CPU priority (the pool's class runs at normal priority, like the scheduler).
"""

from __future__ import annotations

import pytest

from tests.wait import wait_for
from uniun.protocol.embed_client import EmbedClient

from .harness import BASE_CONFIG, Runtime, chat_job, wait_tokens

pytestmark = pytest.mark.integration

# The default priorities: the pool at normal priority (its class), never SCHED_IDLE,
# which could starve the worker until the chat has ended, so it never sees the chat.
CONFIG = BASE_CONFIG.replace(
    "[embed]\nenabled = false", "[embed]\nenabled = true\nworkers = 1")


def test_an_embed_request_accepted_during_a_chat_is_answered_after_it(
        tmp_path, tiny_model: str, minilm_dir) -> None:
    rt = Runtime(tmp_path / "rt", CONFIG)
    rt.env["UNIUN_CHILDREN"] = "scheduler,runner,embed"
    rt.start()
    try:
        status = wait_for("the runtime ready", lambda: (rt.status() or {}).get("ready")
                          and rt.status())
        # The pool is its own process: up after the scheduler's readiness, maybe not yet.
        wait_for("the embedding pool bound", (rt.home / "run" / "embed.endpoint").is_file)
        with EmbedClient(f"ipc://{rt.home / 'run' / 'embed.sock'}", timeout=120) as pool:
            wait_for("the embedding worker ready", lambda: any(
                w.get("state") == "idle" for w in pool.status(timeout=10)["workers"]))
            before = pool.status(timeout=10)["yielded"]
            w = rt.wire()
            chat = chat_job("c-long", max_new_tokens=2000)
            assert w.submit(chat)["type"] == "accepted"
            wait_tokens(w, "c-long", 3)
            vectors = pool.embed(["a note written while the chat ran"], timeout=120)
            # Answered: so the chat has ended by now (it is neither running nor queued).
            after = rt.status()
            assert after is not None
            assert (after.get("running") or {}).get("job_id") != "c-long"
            assert "c-long" not in after["queues"]["T0"]
            assert w.end("c-long")["type"] == "done"
            assert vectors.shape == (1, 384)
            counters = pool.status(timeout=10)
            assert counters["yielded"] == before + 1 and counters["rejected_full"] == 0
        status = rt.status()
        assert status is not None
        info = status["process_info"]
        assert info["scheduler"]["priority"] == "normal"
        assert info["embed"]["priority"] == "normal"  # its class: it answers the user's apps
    finally:
        rt.stop()
