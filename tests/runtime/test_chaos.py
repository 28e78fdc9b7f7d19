"""``uniun-runtime chaos``: the verdict's rules on hand-made histories, and a short run.

The short run is the product's own harness against a runtime of its own (every process,
the real model, ZeroMQ): a few runner and scheduler kills and a client that leaves
mid-stream, and the verdict must pass. The long run is documented in
docs/chaos.md with its last result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest
import zmq

from uniun.runtime.chaos.faults import Fault
from uniun.runtime.chaos.harness import ChaosOptions, run_chaos
from uniun.runtime.chaos.ledger import Ledger
from uniun.runtime.chaos.verdict import judge, render
from uniun.runtime.chaos.wire import ChaosWire
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


def _pump_until(wire: ChaosWire, done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        wire.pump(0.05)


def _read(router: zmq.Socket, n: int) -> list[tuple[bytes, dict]]:
    out = []
    for _ in range(n):
        assert router.poll(20_000), f"only {len(out)} of {n} requests came"
        conn, frame = router.recv_multipart()
        out.append((conn, msgpack.unpackb(frame)))
    return out


def test_after_a_lost_scheduler_the_wire_attaches_open_jobs_before_re_sending_submits(
        tmp_path: Path) -> None:
    # A re-sent submit of a known job subscribes; an attach replays and subscribes. Sent
    # submit-first, a token streamed between the two reached the client twice (a CI
    # run's "duplicated"); attach-first, the scheduler replays once, then acknowledges.
    endpoint = f"ipc://{tmp_path}/front.sock"
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    ledger = Ledger()
    wire = ChaosWire(endpoint, ledger, time.monotonic)
    try:
        for job_id in ("streaming", "unanswered"):
            wire.submit({"job_id": job_id, "kind": "extract", "prompt": "p"}, "bg0")
        _pump_until(wire, lambda: wire.handshakes == 1, "the first handshake")
        (conn, first), _ = _read(router, 2)
        router.send_multipart([conn, msgpack.packb(
            {"v": 1, "type": "accepted", "re": first["id"], "job_id": "streaming"})])
        router.send_multipart([conn, msgpack.packb(
            {"v": 1, "type": "token", "job_id": "streaming", "seq": 0, "text": "a"})])
        _pump_until(wire, lambda: ledger.jobs["streaming"].tokens == {0: "a"}, "the token")

        router.close(linger=0)  # the scheduler dies with the second submit unanswered
        router = ctx.socket(zmq.ROUTER)
        router.bind(endpoint)
        _pump_until(wire, lambda: wire.handshakes == 2, "the handshake with a new scheduler")
        sent = [msg for _, msg in _read(router, 3)]
    finally:
        wire.close()
        router.close(linger=0)
    assert [(m["type"], m.get("job_id") or m["job"]["job_id"], m.get("after_seq"))
            for m in sent] == [("attach", "streaming", 0), ("attach", "unanswered", -1),
                               ("submit", "unanswered", None)]


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
