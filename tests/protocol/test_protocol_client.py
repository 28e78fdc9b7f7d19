"""The client library against a FakeScheduler (a real ROUTER socket in a thread).

Timeouts are short where a test *expects* one, generous everywhere else, so the tests
do not flake on a loaded two-core machine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests.protocol.protocol_fakes import FakeScheduler
from tests.wait import wait_for
from uniun.protocol import messages as m
from uniun.protocol.client import Client, ClientError, JobFailed, SchedulerUnavailable, Timeout
from uniun.protocol.codec import EncodeError

WAIT = 30.0  # seconds: generous, for anything that should succeed

Make = Callable[..., FakeScheduler]


def _prompt(job_id: str, **extra: Any) -> dict[str, Any]:
    return {"job_id": job_id, "kind": "extract", "prompt": "hi", **extra}


def assert_answers_ping(client: Client, fake: FakeScheduler) -> None:
    """The client's ping went to this scheduler and its pong came back: a round trip,
    which ``ping()`` returns, of a real request (a ping answered from a cache, or by
    nobody, would not have reached ``fake``)."""
    before = sum(r["type"] == "ping" for r in fake.received)
    rtt = client.ping()
    assert sum(r["type"] == "ping" for r in fake.received) == before + 1
    assert 0.0 < rtt < WAIT


def test_submit_streams_tokens_in_order_and_ends_with_done(ipc_endpoint: str,
                                                           fake_scheduler: Make) -> None:
    fake_scheduler(ipc_endpoint)
    with Client(ipc_endpoint, timeout=WAIT) as client:
        stream = client.submit(_prompt("j1"))
        events = list(stream)
    assert stream.accepted is not None and stream.accepted["type"] == m.ACCEPTED
    assert stream.accepted["job_id"] == "j1"
    assert [e["type"] for e in events] == ["started", "token", "token", "token", "token", "done"]
    assert [e["seq"] for e in events if e["type"] == "token"] == [0, 1, 2, 3]
    assert events[-1]["text"] == "Hello, world"
    assert stream.final is events[-1]


def test_submit_generates_a_job_id_and_result_returns_done(ipc_endpoint: str,
                                                           fake_scheduler: Make) -> None:
    fake = fake_scheduler(ipc_endpoint)
    with Client(ipc_endpoint, timeout=WAIT) as client:
        stream = client.submit({"kind": "chat", "prompt": "hi"})
        done = stream.result(timeout=WAIT)
    assert done["text"] == "Hello, world"
    assert fake.received[0]["job"]["job_id"] == stream.job_id and stream.job_id


def test_tcp_endpoint_works(fake_scheduler: Make) -> None:
    fake = fake_scheduler("tcp://127.0.0.1:*")
    with Client(fake.bound_endpoint, timeout=WAIT) as client:
        assert_answers_ping(client, fake)
        assert "".join(client.submit(_prompt("t1")).tokens()) == "Hello, world"


def test_two_jobs_stream_at_once_and_events_are_routed_by_job_id(
        ipc_endpoint: str, fake_scheduler: Make) -> None:
    fake = fake_scheduler(ipc_endpoint, auto_stream=False)
    with Client(ipc_endpoint, timeout=WAIT) as client:
        a = client.submit(_prompt("a"))
        b = client.submit(_prompt("b"))
        fake.jobs["b"].tokens = ["B0", "B1", "B2"]

        def interleave(f: FakeScheduler) -> None:
            for i in range(4):
                f.stream("a", upto=i + 1, finish=False)
                f.stream("b", upto=min(i + 1, 3))
            f.stream("a")
        fake.call(interleave)
        b_text = "".join(b.tokens())  # a's events are buffered meanwhile
        a_text = "".join(a.tokens())
    assert (a_text, b_text) == ("Hello, world", "B0B1B2")


def test_error_reply_raises_client_error_with_code_field_and_retryable(
        ipc_endpoint: str, fake_scheduler: Make) -> None:
    fake = fake_scheduler(ipc_endpoint)
    with Client(ipc_endpoint, timeout=WAIT) as client:
        with pytest.raises(ClientError) as info:
            client.submit({"job_id": "x", "kind": "chat", "prompt": "hi", "max_new_tokens": 0})
        assert info.value.code == "invalid_field"
        assert info.value.field == "max_new_tokens"
        assert info.value.retryable is False
        with pytest.raises(ClientError) as info:
            client.attach("never-submitted")
        assert info.value.code == "not_found"
        assert_answers_ping(client, fake)  # still usable


def test_cancel_ends_the_stream_and_unknown_job_is_not_found(ipc_endpoint: str,
                                                            fake_scheduler: Make) -> None:
    fake = fake_scheduler(ipc_endpoint, auto_stream=False)
    with Client(ipc_endpoint, timeout=WAIT) as client:
        stream = client.submit(_prompt("c1"))
        fake.call(lambda f: f.stream("c1", upto=2, finish=False))
        first = [stream.next_event(timeout=WAIT) for _ in range(3)]
        assert [e["type"] for e in first] == ["started", "token", "token"]
        reply = stream.cancel()
        assert reply["type"] == m.CANCELLED and reply["job_id"] == "c1"
        assert list(stream) == []
        with pytest.raises(JobFailed):
            stream.result()
        with pytest.raises(ClientError) as info:
            client.cancel("c1")
        assert info.value.code == "not_found"


def test_attach_from_a_second_client_skips_tokens_it_already_has(
        ipc_endpoint: str, fake_scheduler: Make) -> None:
    fake = fake_scheduler(ipc_endpoint, auto_stream=False)
    with Client(ipc_endpoint, timeout=WAIT) as first:
        first.submit(_prompt("j"))
        fake.call(lambda f: f.stream("j", upto=2, finish=False))
    with Client(ipc_endpoint, timeout=WAIT) as second:
        stream = second.attach("j", after_seq=1)
        assert stream.accepted is not None and stream.accepted["state"] == "running"
        fake.call(lambda f: f.stream("j"))
        tokens = [e for e in stream if e["type"] == "token"]
    assert [t["seq"] for t in tokens] == [2, 3]
    assert fake.received[-1]["type"] == "attach" and fake.received[-1]["after_seq"] == 1


def test_foreground_lifecycle_status_and_ping(ipc_endpoint: str, fake_scheduler: Make) -> None:
    fake = fake_scheduler(ipc_endpoint, status_body={"policy": "uniun", "queues": {"T0": []}})
    with Client(ipc_endpoint, timeout=WAIT) as client:
        client.foreground("extract")
        client.foreground(None)
        client.lifecycle("background")
        assert client.status() == {"policy": "uniun", "queues": {"T0": []}}
        assert_answers_ping(client, fake)
        with pytest.raises(ValueError):
            client.lifecycle("sideways")  # refused locally, nothing sent
    sent = [(r["type"], r.get("kind", r.get("state"))) for r in fake.received]
    assert sent[:3] == [("foreground", "extract"), ("foreground", None),
                        ("lifecycle", "background")]
    assert len(sent) == 5


def test_no_scheduler_raises_scheduler_unavailable(ipc_endpoint: str) -> None:
    with (Client(ipc_endpoint, timeout=0.5) as client,
          pytest.raises(SchedulerUnavailable, match="no scheduler")):
        client.status()


def test_silent_scheduler_raises_timeout_and_client_stays_usable(ipc_endpoint: str,
                                                                fake_scheduler: Make) -> None:
    fake = fake_scheduler(ipc_endpoint, answer=lambda msg: msg["type"] != "status")
    with Client(ipc_endpoint, timeout=WAIT) as client:
        with pytest.raises(Timeout):
            client.status(timeout=0.5)
        assert_answers_ping(client, fake)


def test_too_large_job_is_refused_locally_before_sending(ipc_endpoint: str,
                                                         fake_scheduler: Make) -> None:
    fake = fake_scheduler(ipc_endpoint)
    with Client(ipc_endpoint, timeout=WAIT) as client:
        with pytest.raises(EncodeError, match="frame limit"):
            client.submit(_prompt("big", prompt="x" * (2 << 20)))
        client.ping()
    assert [r["type"] for r in fake.received] == ["ping"]


def test_garbage_from_the_scheduler_is_dropped_not_fatal(ipc_endpoint: str,
                                                         fake_scheduler: Make) -> None:
    fake = fake_scheduler(ipc_endpoint, auto_stream=False)
    with Client(ipc_endpoint, timeout=WAIT) as client:
        stream = client.submit(_prompt("g"))
        owner = fake.jobs["g"].owner
        assert owner is not None

        def junk(f: FakeScheduler) -> None:
            f.send_raw(owner, b"\xc1garbage")
            f.send_raw(owner, b"\x93\x01\x02\x03")  # a list, not a map
            f.send(owner, {"v": 1, "type": "token", "job_id": "g", "seq": "zero", "text": 1})
            f.stream("g")
        fake.call(junk)
        assert stream.result(timeout=WAIT)["text"] == "Hello, world"


def test_lost_scheduler_without_reconnect_raises(ipc_endpoint: str, fake_scheduler: Make) -> None:
    fake = fake_scheduler(ipc_endpoint, auto_stream=False)
    with Client(ipc_endpoint, timeout=WAIT, reconnect=False) as client:
        stream = client.submit(_prompt("l"))
        fake.stop()
        with pytest.raises(SchedulerUnavailable, match="lost"):
            list(stream)


def test_lost_scheduler_that_never_returns_raises_after_reconnect_timeout(
        ipc_endpoint: str, fake_scheduler: Make) -> None:
    fake = fake_scheduler(ipc_endpoint, auto_stream=False)
    with Client(ipc_endpoint, timeout=WAIT, reconnect_timeout=0.5) as client:
        stream = client.submit(_prompt("n"))
        fake.stop()
        with pytest.raises(SchedulerUnavailable, match="did not come back"):
            list(stream)


def test_hung_scheduler_is_detected_by_unanswered_pings(ipc_endpoint: str,
                                                        fake_scheduler: Make) -> None:
    fake_scheduler(ipc_endpoint, auto_stream=False,
                   answer=lambda msg: msg["type"] == "submit")
    with Client(ipc_endpoint, timeout=0.3, heartbeat_s=0.1, reconnect_timeout=2.0) as client:
        stream = client.submit(_prompt("h"), timeout=WAIT)
        with pytest.raises(SchedulerUnavailable, match="not answered"):
            list(stream)
        assert client.reconnects >= 1


def test_reconnect_and_attach_keeps_the_stream_going_without_duplicates(
        ipc_endpoint: str, fake_scheduler: Make) -> None:
    tokens = [f"t{i} " for i in range(8)]
    first = fake_scheduler(ipc_endpoint, tokens=tokens, auto_stream=False)
    with Client(ipc_endpoint, timeout=WAIT, reconnect_timeout=WAIT) as client:
        stream = client.submit(_prompt("r"))
        first.call(lambda f: f.stream("r", upto=3, finish=False))
        got = [stream.next_event(timeout=WAIT) for _ in range(4)]  # started + 3 tokens
        first.stop()  # the scheduler dies; the job lives on in its (shared) journal
        first.jobs["r"].auto = True  # and the restarted one runs it to the end
        # The restarted scheduler re-sends 2 tokens the client already holds.
        second = fake_scheduler(ipc_endpoint, jobs=first.jobs, replay_overlap=2)
        got += list(stream)
    seqs = [e["seq"] for e in got if e["type"] == "token"]
    assert seqs == list(range(8))
    assert got[-1]["type"] == "done" and got[-1]["text"] == "".join(tokens)
    assert stream.missed_tokens == 0 and client.reconnects == 1
    attach = [r for r in second.received if r["type"] == "attach"]
    assert attach and attach[0]["job_id"] == "r" and attach[0]["after_seq"] == 2


def test_submit_in_flight_when_the_scheduler_dies_is_resent_after_reconnect(
        ipc_endpoint: str, fake_scheduler: Make) -> None:
    first = fake_scheduler(ipc_endpoint, answer=lambda msg: msg["type"] != "submit")
    with Client(ipc_endpoint, timeout=WAIT, reconnect_timeout=WAIT) as client:
        client.ping()

        def restart_when_submit_arrives() -> None:
            wait_for("submit", lambda: any(r["type"] == "submit" for r in first.received), WAIT)
            first.stop()
            fake_scheduler(ipc_endpoint)
        restarter = threading.Thread(target=restart_when_submit_arrives)
        restarter.start()
        stream = client.submit(_prompt("s"))
        restarter.join(WAIT)
        assert stream.result(timeout=WAIT)["text"] == "Hello, world"
    submitted = [r["id"] for r in first.received if r["type"] == "submit"]
    assert len(submitted) == 1


def test_a_submit_unanswered_through_two_scheduler_losses_is_poisoned_not_resent(
        ipc_endpoint: str, fake_scheduler: Make) -> None:
    """Fake schedulers that never answer a submit stand for ones that die validating it:
    each is closed once the submit reached it, and a new one opened on the endpoint."""
    silent = {"answer": lambda msg: msg["type"] != "submit"}
    fakes = [fake_scheduler(ipc_endpoint, **silent)]

    def die_when_the_submit_arrives() -> None:
        for nth in (1, 2):
            wait_for(f"submit at fake {nth}",
                     lambda: any(r["type"] == "submit" for r in fakes[-1].received), WAIT)
            fakes[-1].stop()
            fakes.append(fake_scheduler(ipc_endpoint, **(silent if nth == 1 else {})))

    with Client(ipc_endpoint, timeout=WAIT, reconnect_timeout=WAIT) as client:
        client.ping()
        restarter = threading.Thread(target=die_when_the_submit_arrives)
        restarter.start()
        with pytest.raises(ClientError) as err:
            client.submit(_prompt("poison"))
        restarter.join(WAIT)
        assert err.value.code == "poisoned" and err.value.retryable is False
        assert err.value.job_id == "poison"
        assert "in flight through 2 scheduler restarts" in err.value.message
        assert client.reconnects == 2 and len(fakes) == 3
        assert_answers_ping(client, fakes[2])  # the third one hears from the client ...
    submits = [[r["id"] for r in f.received if r["type"] == "submit"] for f in fakes]
    assert submits[0] == submits[1] and len(submits[0]) == 1  # ... but not the submit
    assert submits[2] == []


def stream_one_after_attach(fake: FakeScheduler, upto: int) -> None:
    """Once the client has re-attached to ``fake``, stream job ``long`` up to ``upto``."""
    wait_for("the re-attach", lambda: any(r["type"] == "attach" for r in fake.received), WAIT)
    fake.call(lambda f: f.stream("long", upto=upto, finish=False))


def test_a_streaming_submit_is_reattached_through_any_number_of_losses(
        ipc_endpoint: str, fake_scheduler: Make) -> None:
    tokens = [f"t{i} " for i in range(6)]
    fake = fake_scheduler(ipc_endpoint, tokens=tokens, auto_stream=False)
    with Client(ipc_endpoint, timeout=WAIT, reconnect_timeout=WAIT) as client:
        stream = client.submit(_prompt("long"))  # answered: no longer a suspect
        got = [stream.next_event(timeout=WAIT)]  # started
        for n in range(3):  # three losses; each new scheduler streams one more token
            fake.stop()
            fake = fake_scheduler(ipc_endpoint, jobs=fake.jobs, auto_stream=False)
            helper = threading.Thread(target=stream_one_after_attach, args=(fake, n + 1))
            helper.start()
            got.append(stream.next_event(timeout=WAIT))  # reconnects and re-attaches
            helper.join(WAIT)
        fake.jobs["long"].auto = True
        fake.call(lambda f: f.stream("long"))
        got += list(stream)
    assert [e["seq"] for e in got if e["type"] == "token"] == list(range(6))
    assert got[-1]["type"] == "done" and client.reconnects == 3
