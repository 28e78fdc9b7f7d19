"""The wire fuzzer (runtime/chaos/fuzz.py), bounded, against a runtime of its own.

A fuzz run changes the scheduler's state on purpose (foreground, lifecycle, jobs under the
shared ``fz-job-*`` ids), so it gets a private runtime rather than the session's. The
bound keeps it to seconds; ``uniun-runtime fuzz --frames 10000`` is the long run
(docs/fuzzing.md).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from uniun.runtime.chaos.fuzz import run_wire_fuzz
from uniun.runtime.chaos.fuzz_frames import HOSTILE_MODEL_IDS

from .harness import Runtime

pytestmark = pytest.mark.integration

CI_FRAMES = 300


def test_hostile_frames_are_each_answered_once_per_the_table(
        make_runtime: Callable[..., Runtime]) -> None:
    rt = make_runtime()
    w = rt.wire()
    # The named hostile model ids first, each on its own: refused by the table's codes.
    for i, model_id in enumerate(HOSTILE_MODEL_IDS):
        reply = w.request("submit", job={"job_id": f"m{i}", "kind": "gana", "prompt": "x",
                                         "model_id": model_id})
        assert reply["type"] == "error", (model_id, reply)
        assert (reply["code"], reply["field"]) in (("invalid_field", "model_id"),
                                                   ("unknown_model", "model_id")), reply
    # A key too big to echo still gets its one reply.
    reply = w.request("submit", job={"job_id": "big", "kind": "gana", "prompt": "x",
                                     "k" * 600_000: 1})
    assert reply["code"] == "invalid_field" and len(reply["field"]) < 100
    report = run_wire_fuzz(rt.endpoint, CI_FRAMES, seed=13)
    assert report.ok, report.text()
    assert report.frames == CI_FRAMES
    assert "internal" not in report.replies
    # The run reached past the envelope: jobs were refused by field and some accepted.
    assert report.replies["invalid_field"] > 0 and report.replies["accepted"] > 0
    assert report.scheduler_pid_before == report.scheduler_pid_after == rt.pid("scheduler")
