"""Acknowledged means kept, end to end: a runtime restarted with a lower
``max_prompt_chars`` and one kind fewer still holds every job it had accepted.

Scheduler-only runtimes (no runner): the jobs stay queued, so nothing here depends on
how fast a model runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import BASE_CONFIG, PROMPT, Runtime, wait_for

pytestmark = pytest.mark.integration

RAISED = BASE_CONFIG + "\n[limits]\nmax_prompt_chars = 300000\n"
# today's configuration: the default limit (200,000) and no "gana"
LOWERED = BASE_CONFIG + '\n[jobs]\nkinds = ["chat", "extract", "nataraj"]\n'


def scheduler_only(home: Path, config: str) -> Runtime:
    """A runtime of the scheduler alone, started: serving once ``status`` answers."""
    rt = Runtime(home, config)
    rt.env["UNIUN_CHILDREN"] = "scheduler"
    rt.LOGGED = ("supervisor", "scheduler")
    rt.wait_serving = lambda: wait_for("the scheduler to answer status",  # type: ignore[method-assign]
                                       lambda: rt.status(timeout=2.0))
    return rt.start()


def stopped(rt: Runtime) -> None:
    code = rt.stop()
    print(rt.logs())
    assert code == 0


def test_a_restart_with_a_lower_prompt_limit_keeps_the_job_and_dead_letters_a_removed_kind(
        tmp_path: Path, tiny_model: str) -> None:
    home = tmp_path / "home"
    rt = scheduler_only(home, RAISED)
    try:
        w = rt.wire()
        big = {"job_id": "big", "kind": "extract", "prompt": "x" * 250_000,
               "max_new_tokens": 4}
        assert w.submit(big)["type"] == "accepted"
        assert w.submit({"job_id": "g", "kind": "gana", "prompt": PROMPT,
                         "max_new_tokens": 4})["type"] == "accepted"
    finally:
        stopped(rt)

    rt = scheduler_only(home, LOWERED)
    try:
        w = rt.wire()
        kept = w.request("attach", job_id="big")
        assert (kept["type"], kept.get("state")) == ("accepted", "queued"), kept
        status = rt.status()
        assert status is not None
        assert any("big" in ids for ids in status["queues"].values()), status["queues"]
        assert status["dead_letters"]["count"] == 1, status
        [letter] = status["dead_letters"]["recent"]
        assert (letter["job_id"], letter["kind"]) == ("g", "gana")
        gone = w.request("attach", job_id="g")
        assert (gone["type"], gone["code"]) == ("error", "not_found"), gone
        assert "kind 'gana' is not in [jobs] kinds" in gone["message"]
        # too long for today's limit when sent again; the accepted one was kept
        again = w.submit({**big, "job_id": "big-2"})
        assert (again["type"], again.get("code")) == ("error", "invalid_field"), again
    finally:
        stopped(rt)
