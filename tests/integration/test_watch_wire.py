"""``watch``: a client follows the scheduler's state as it changes, on a real runtime.

The watcher is the product's own ``Client`` (``watch`` / ``next_state``); the jobs come
from a raw wire client, as another app would send them.
"""

from __future__ import annotations

from typing import Any

import pytest

from uniun.protocol.client import Client

from .harness import Runtime, chat_job, long_job, wait_tokens

pytestmark = pytest.mark.integration


def collect(client: Client, until: Any, limit: int = 2000) -> list[dict[str, Any]]:
    """State pushes until ``until(pushes)`` holds (a generous cap on their number)."""
    pushes: list[dict[str, Any]] = []
    for _ in range(limit):
        push = client.next_state(timeout=60)
        assert push is not None, f"no state push; so far: {pushes[-3:]}"
        pushes.append(push)
        if until(pushes):
            return pushes
    raise AssertionError(f"condition never held; last pushes: {pushes[-3:]}")


def marks(pushes: list[dict[str, Any]], what: str, job_id: str) -> list[dict[str, Any]]:
    return [mk for p in pushes for mk in p.get("marks", ())
            if mk["what"] == what and mk["job_id"] == job_id]


def test_a_watcher_sees_the_preemption_and_the_resume_as_they_happen(
        runtime: Runtime) -> None:
    with Client(runtime.endpoint, timeout=30) as watcher:
        watcher.watch()
        first = watcher.next_state(timeout=60)
        assert first is not None and first["status"]["policy"] == "uniun"
        w = runtime.wire()
        w.submit(long_job("wt-bg", "nataraj"))
        wait_tokens(w, "wt-bg")
        w.submit(chat_job("wt-chat"))
        assert w.end("wt-chat")["type"] == "done"
        assert w.end("wt-bg")["type"] == "done"
        pushes = collect(watcher, lambda ps: finished(ps, "wt-bg") is not None
                         and any("status" in p for p in ps[finished(ps, "wt-bg"):]))
        preempt = marks(pushes, "preempt", "wt-bg")
        assert preempt and "wt-chat" in preempt[0]["detail"]
        assert marks(pushes, "resume", "wt-bg")
        runs = [s for p in pushes for s in p.get("segments", ())
                if s["job_id"] == "wt-chat" and s["lane"] == "run"]
        assert runs and runs[0]["kind"] == "chat" and runs[0]["tier"] == 0
        # The change that ended the job is followed by a status push that shows it.
        after = [p["status"] for p in pushes[finished(pushes, "wt-bg"):] if "status" in p]
        assert after[-1]["running"] is None and "wt-bg" not in str(after[-1]["queues"])


def finished(pushes: list[dict[str, Any]], job_id: str) -> int | None:
    """Index of the push with ``job_id``'s last run segment (it ended done)."""
    for i, push in enumerate(pushes):
        if any(s["job_id"] == job_id and s["lane"] == "run" and s["reason"] == "done"
               for s in push.get("segments", ())):
            return i
    return None


def test_a_quiet_scheduler_pushes_no_status(runtime: Runtime) -> None:
    with Client(runtime.endpoint, timeout=30) as watcher:
        watcher.watch()
        assert watcher.next_state(timeout=60) is not None  # the first, after ok
        runtime.status()  # asking is not a change
        assert watcher.next_state(timeout=1.0) is None
