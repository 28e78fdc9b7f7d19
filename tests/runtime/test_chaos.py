"""``uniun-runtime chaos``: the verdict's rules on hand-made histories, and a short run.

The short run is the product's own harness against a runtime of its own (every process,
the real model, ZeroMQ): a few runner and scheduler kills and a client that leaves
mid-stream, and the verdict must pass. The long run is documented in
docs/chaos.md with its last result.
"""

from __future__ import annotations

import pytest

from uniun.runtime.chaos.faults import Fault
from uniun.runtime.chaos.harness import ChaosOptions, run_chaos
from uniun.runtime.chaos.ledger import Ledger
from uniun.runtime.chaos.verdict import judge, render
from uniun.runtime.chaos.workload import WorkloadSettings


def _job(ledger: Ledger, job_id: str, kind: str = "extract") -> None:
    ledger.submitted({"job_id": job_id, "kind": kind}, "bg0", 0.0)
    ledger.accepted(job_id, 0.1)


def _tokens(ledger: Ledger, job_id: str, seqs: list[int]) -> None:
    for seq in seqs:
        ledger.event({"type": "token", "job_id": job_id, "seq": seq, "text": f"t{seq}"})


def _done(job_id: str, text: str, n: int) -> dict:
    return {"type": "done", "job_id": job_id, "text": text,
            "usage": {"completion_tokens": n}}


def test_the_verdict_names_lost_duplicated_differing_gapped_and_unexpected_jobs() -> None:
    ledger = Ledger()
    for job_id in ("good", "lost", "dup", "differs", "gap", "odd"):
        _job(ledger, job_id)
    _tokens(ledger, "good", [0, 1])
    ledger.event(_done("good", "t0t1", 2))
    ledger.event(_done("good", "t0t1", 2))  # a redelivery after a re-attach: fine
    _tokens(ledger, "lost", [0])
    _tokens(ledger, "dup", [0, 1, 1])
    ledger.event(_done("dup", "t0t1", 2))
    _tokens(ledger, "differs", [0, 1])
    ledger.event(_done("differs", "t0t1 and a tail", 2))  # not the fault-free text
    _tokens(ledger, "gap", [0, 2])
    ledger.event(_done("gap", "t0t1", 2))
    ledger.event({"type": "error", "job_id": "odd", "code": "internal", "retryable": False})
    ledger.event({"type": "token", "job_id": "nobody", "seq": 0, "text": "x"})
    verdict = judge(ledger, [], None, {"bg0": "t0t1"}, meta={"seed": 1})
    ex = verdict["examples"]
    assert ex["lost"] == ["lost"] and ex["duplicated"] == ["dup"]
    assert ex["text_differs"] == ["differs"] and ex["token_gaps"] == ["gap"]
    assert set(ex["unexpected"]) == {"odd", "stray:nobody"}
    assert verdict["jobs"]["completed"] == 4 and not verdict["ok"]
    assert "FAIL" in render(verdict)


def test_a_chat_cut_off_by_a_runner_kill_is_allowed_its_runner_failed() -> None:
    ledger = Ledger()
    _job(ledger, "talk", kind="chat")
    ledger.fault("kill:runner")
    ledger.event({"type": "error", "job_id": "talk", "code": "runner_failed",
                  "retryable": True})
    _job(ledger, "bg")
    ledger.event(_done("bg", "t0t1", 0))  # zero tokens: nothing to stream
    fault = Fault("kill:runner", "runner", 1, at=1.0, recovered_at=2.5)
    verdict = judge(ledger, [fault], None, {"bg0": "t0t1"}, meta={})
    assert verdict["ok"], verdict
    assert verdict["jobs"]["failed_as_allowed"] == 1
    assert verdict["recovery_s"]["kill:runner"] == {"n": 1, "p50": 1.5, "max": 1.5}


@pytest.mark.integration
def test_a_short_chaos_run_against_a_runtime_of_its_own_passes(tiny_model: str) -> None:
    verdict = run_chaos(ChaosOptions(
        kills=3, duration_s=9.0, seed=11, model=tiny_model, embeds=False,
        kinds=("kill:runner", "kill:scheduler", "disconnect"),
        children=("scheduler", "runner"),  # the two whose death can lose work
        workload=WorkloadSettings(background=2, bg_tokens=150, chat_every_s=2.0)))
    assert verdict["ok"], render(verdict)
    assert verdict["faults_injected"] == 3 and not verdict["unrecovered"]
    assert verdict["jobs"]["lost"] == 0 and verdict["jobs"]["duplicated"] == 0
    assert verdict["jobs"]["completed"] > 0
