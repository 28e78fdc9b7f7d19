"""Crash recovery end to end: SIGKILL of the runner and of the scheduler.

The supervisor restarts the killed process (nothing in the test does). What a user must
see: a background job finishes with every token exactly once (``seq`` gap-free) and the
same greedy text as a run that was never interrupted; a chat that was cut off gets an
explicit retryable error instead of a silent re-run; every job the scheduler had
acknowledged completes after the scheduler itself was killed.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from uniun.protocol.client import Client

from .harness import (
    BASE_CONFIG,
    Runtime,
    assert_gap_free,
    chat_job,
    long_job,
    tokens_of,
    wait_for,
    wait_tokens,
)

pytestmark = pytest.mark.integration

# No memory for parked snapshots: every paused job is spilled to disk at once, so a
# spilled snapshot exists to survive a runner kill.
CONFIG = BASE_CONFIG + "\n[runner]\nsnapshot_cap_bytes = 0\n"


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Iterator[Runtime]:
    runtime = Runtime(tmp_path_factory.mktemp("rt-restarts"), CONFIG).start()
    try:
        yield runtime
    finally:
        runtime.stop()
        print(runtime.logs())


def test_runner_sigkill_mid_job_resumes_without_gaps_or_repeats(rt: Runtime,
                                                               reference: str) -> None:
    w = rt.wire()
    w.submit(long_job("rk-bg", "extract"))
    wait_tokens(w, "rk-bg", 200)
    rt.kill("runner", signal.SIGKILL)
    done = w.end("rk-bg")
    assert done["type"] == "done", done
    events = w.events("rk-bg")
    assert_gap_free(events)
    started = [e for e in events if e["type"] == "started"]
    assert [s["resumed"] for s in started] == [False, True]
    assert "".join(t["text"] for t in tokens_of(events)) == done["text"] == reference
    assert rt.status()["processes"]["runner"] != started[0].get("pid", -1)


def test_runner_sigkill_during_a_chat_is_a_retryable_error(rt: Runtime) -> None:
    w = rt.wire()
    w.submit(chat_job("rk-chat", max_new_tokens=2500))
    wait_tokens(w, "rk-chat", 50)
    rt.kill("runner", signal.SIGKILL)
    end = w.end("rk-chat")
    assert end["type"] == "error" and end["code"] == "runner_failed"
    assert end["retryable"] is True
    assert not any(e["type"] == "done" for e in w.events("rk-chat"))
    rt.wait_serving()
    w.submit(chat_job("rk-chat-retry"))  # the retry the error invites works
    assert w.end("rk-chat-retry")["type"] == "done"


def test_runner_sigkill_spares_a_spilled_snapshot_which_the_new_runner_resumes(
        rt: Runtime, reference: str) -> None:
    w = rt.wire()
    w.submit(long_job("sp-bg", "nataraj"))
    wait_tokens(w, "sp-bg", 100)
    w.submit(chat_job("sp-chat", max_new_tokens=2500))  # parks (spills) the nataraj job
    wait_tokens(w, "sp-chat", 20)
    assert w.log[w.index("sp-bg", "paused")]["reason"] == "preempted"
    assert wait_for("the parked job's spill file",
                    lambda: list((rt.home / "run" / "spill").glob("*.kvsnap")))
    rt.kill("runner", signal.SIGKILL)
    assert w.end("sp-chat")["code"] == "runner_failed"
    done = w.end("sp-bg")
    assert done["type"] == "done"
    events = w.events("sp-bg")
    assert_gap_free(events)
    assert "".join(t["text"] for t in tokens_of(events)) == done["text"] == reference
    runner_log = (rt.home / "logs" / "runner.log").read_text()
    assert "continuing from the spilled snapshot" in runner_log  # not a recompute


def test_scheduler_sigkill_with_jobs_queued_completes_every_acknowledged_job(
        rt: Runtime, reference: str) -> None:
    with Client(rt.endpoint, timeout=30, reconnect_timeout=120) as client:
        running = client.submit(long_job("sk-running", "extract"))
        queued = [client.submit({"job_id": f"sk-queued-{i}", "kind": kind, "prompt": "later",
                                 "max_new_tokens": 8})
                  for i, kind in enumerate(("nataraj", "gana", "extract"))]
        seen = []
        for event in running:
            if event["type"] == "token":
                seen.append(event)
                if len(seen) == 100:
                    break
        rt.kill("scheduler", signal.SIGKILL)
        rest = list(running)  # the client reconnects and re-attaches by itself
        done = rest[-1]
        assert done["type"] == "done", done
        tokens = seen + [e for e in rest if e["type"] == "token"]
        assert [t["seq"] for t in tokens] == list(range(len(tokens)))
        assert running.missed_tokens == 0
        assert "".join(t["text"] for t in tokens) == done["text"] == reference
        for stream in queued:
            assert stream.result(timeout=120)["type"] == "done"
        assert client.reconnects >= 1
