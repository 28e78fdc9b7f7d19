"""Job control through the wire: cancel, idempotent submit, attach after a reconnect."""

from __future__ import annotations

import pytest

from uniun.protocol.client import Client

from .harness import Runtime, assert_gap_free, long_job, tokens_of, wait_tokens

pytestmark = pytest.mark.integration


def test_cancel_of_a_running_job_stops_it_and_the_runner_moves_on(runtime: Runtime) -> None:
    w = runtime.wire()
    w.submit(long_job("c-run", "nataraj"))
    wait_tokens(w, "c-run")
    reply = w.request("cancel", job_id="c-run")
    assert reply["type"] == "cancelled" and reply["job_id"] == "c-run"
    end = w.end("c-run")
    assert end["type"] == "error" and end["code"] == "cancelled"
    assert not any(e["type"] == "done" for e in w.events("c-run"))
    assert len(tokens_of(w.events("c-run"))) < 2500
    # The runner is free again: the next job runs to its end.
    w.submit({"job_id": "c-after", "kind": "extract", "prompt": "next", "max_new_tokens": 5})
    assert w.end("c-after")["type"] == "done"
    status = runtime.status()
    assert "c-run" not in str(status["queues"]) and status["running"] is None


def test_cancel_of_a_queued_job_removes_it_before_it_runs(runtime: Runtime) -> None:
    w = runtime.wire()
    w.submit(long_job("cq-first", "nataraj"))
    wait_tokens(w, "cq-first")
    w.submit(long_job("cq-queued", "nataraj"))
    assert "cq-queued" in runtime.status()["queues"]["T4"]
    assert w.request("cancel", job_id="cq-queued")["type"] == "cancelled"
    end = w.end("cq-queued")
    assert end["type"] == "error" and end["code"] == "cancelled"
    assert "cq-queued" not in str(runtime.status()["queues"])
    assert w.request("cancel", job_id="cq-first")["type"] == "cancelled"
    w.end("cq-first")
    assert not any(e["type"] == "started" for e in w.events("cq-queued"))
    # Cancelling again is harmless; an unknown id is not found.
    assert w.request("cancel", job_id="cq-queued")["type"] == "cancelled"
    missing = w.request("cancel", job_id="cq-never-submitted")
    assert missing["type"] == "error" and missing["code"] == "not_found"


def test_resubmit_with_the_same_id_is_acknowledged_and_runs_once(runtime: Runtime) -> None:
    w = runtime.wire()
    job = {"job_id": "idem", "kind": "extract", "prompt": "same job", "max_new_tokens": 12}
    first, second = w.submit(job), w.submit(job)
    assert first["type"] == second["type"] == "accepted"
    done = w.end("idem")
    assert done["type"] == "done"
    again = w.submit(job)  # after it finished: acknowledged with its outcome, not re-run
    assert again["type"] == "accepted" and again["state"] == "ended"
    w.wait(lambda m: m.get("job_id") == "idem" and m["type"] == "done",
           start=w.log.index(again))
    events = w.events("idem")
    assert sum(e["type"] == "started" for e in events) == 1
    assert_gap_free([e for e in events if e["type"] == "token"])
    other = w.submit({**job, "prompt": "a different job"})
    assert other["type"] == "error" and other["code"] == "invalid_field"
    assert other["field"] == "job_id"


def test_attach_after_a_client_reconnect_continues_the_stream(runtime: Runtime) -> None:
    first = Client(runtime.endpoint, timeout=30)
    stream = first.submit(long_job("att", "extract"))
    held = []
    for event in stream:
        if event["type"] == "token":
            held.append(event)
            if len(held) == 5:
                break
    first.close()  # the client goes away mid-stream (its job keeps running)

    with Client(runtime.endpoint, timeout=30) as second:
        resumed = second.attach("att", after_seq=held[-1]["seq"])
        assert resumed.accepted is not None and resumed.accepted["type"] == "accepted"
        rest = list(resumed)
    done = rest[-1]
    assert done["type"] == "done"
    tokens = held + [e for e in rest if e["type"] == "token"]
    assert [t["seq"] for t in tokens] == list(range(len(tokens)))
    assert "".join(t["text"] for t in tokens) == done["text"]
    assert done["usage"]["completion_tokens"] == len(tokens)

    w = runtime.wire()
    unknown = w.request("attach", job_id="no-such-job")
    assert unknown["type"] == "error" and unknown["code"] == "not_found"


def test_background_lifecycle_grants_a_quarter_then_holds_until_foreground(
        runtime: Runtime) -> None:
    w = runtime.wire()
    assert w.request("lifecycle", state="background")["type"] == "ok"
    try:
        w.submit({"job_id": "lc", "kind": "nataraj", "prompt": "hello world",
                  "max_new_tokens": 40})
        paused = w.wait(lambda m: m.get("job_id") == "lc" and m["type"] == "paused")
        assert paused["reason"] == "budget"
        assert len(tokens_of(w.events("lc"))) == 10  # 25 % of 40
        status = runtime.status()
        assert "lc" in status["held"] and status["lifecycle"] == "background"
        assert not any(e["type"] == "done" for e in w.events("lc"))
    finally:
        assert w.request("lifecycle", state="foreground")["type"] == "ok"
    done = w.end("lc")
    assert done["type"] == "done" and done["usage"]["completion_tokens"] == 40
    assert done["preemptions"] >= 1
    assert_gap_free(w.events("lc"))


def test_status_carries_every_protocol_field(runtime: Runtime) -> None:
    w = runtime.wire()
    w.submit(long_job("st-running", "nataraj"))
    wait_tokens(w, "st-running")
    w.submit(long_job("st-queued", "gana", flow="gana-a"))
    status = w.request("status")
    try:
        assert status["type"] == "status"
        assert status["policy"] == "uniun" and status["lifecycle"] == "foreground"
        assert status["foreground"] is None and status["loaded_model"] == "tiny-1"
        assert status["running"]["job_id"] == "st-running"
        assert set(status["queues"]) == {"T0", "T1", "T2", "T3", "T4"}
        assert "st-queued" in status["queues"]["T4"]
        assert "nataraj" in status["vruntime"] and 0.0 <= status["t2_share"] <= 1.0
        assert set(status["snapshots"]) == {"count", "bytes"}
        processes = status["processes"]
        assert processes["scheduler"] == runtime.pid("scheduler")
        assert processes["runner"] == runtime.pid("runner")
    finally:
        for job_id in ("st-queued", "st-running"):
            w.request("cancel", job_id=job_id)
            w.end(job_id)


def test_a_cancel_racing_the_finish_gives_exactly_one_terminal_event(runtime: Runtime) -> None:
    """Cancels sent at every point of short jobs, the last token included: each job ends
    once, with ``cancelled`` if the cancel was acknowledged, ``done`` if it came too late
    (``not_found``), and nothing follows its end."""
    w = runtime.wire()
    outcomes: dict[str, str] = {}
    for n in range(18):
        job_id, length = f"race-{n}", 6
        w.submit({"job_id": job_id, "kind": "extract", "prompt": f"race {n}",
                  "max_new_tokens": length})
        at = n % (length + 1) - 1  # -1: at once, before any token
        if at >= 0:
            w.wait(lambda m, j=job_id, s=at: m.get("job_id") == j and "re" not in m
                   and (m["type"] in ("done", "error") or m.get("seq") == s))
        reply = w.request("cancel", job_id=job_id)
        assert reply["type"] == "cancelled" or reply.get("code") == "not_found", reply
        outcomes[job_id] = reply["type"]
        w.end(job_id)
    w.submit({"job_id": "race-fence", "kind": "extract", "prompt": "fence", "max_new_tokens": 2})
    w.end("race-fence")  # anything still owed for the racing jobs came before this
    for job_id, acknowledged in outcomes.items():
        events = w.events(job_id)
        ends = [e for e in events if e["type"] in ("done", "error")]
        assert len(ends) == 1, (job_id, ends)
        assert events[-1] is ends[0], (job_id, events[-3:])
        if acknowledged == "cancelled":
            assert ends[0]["type"] == "error" and ends[0]["code"] == "cancelled", (job_id, ends)
        else:
            assert ends[0]["type"] == "done", (job_id, ends)
    assert "cancelled" in outcomes.values()
