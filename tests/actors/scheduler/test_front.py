"""The front on a real ROUTER socket: fair turns, caps, push-back, clients that go away.

The front is the real actor on a real ipc socket with real DEALER clients; only the policy
host behind it is a fake (:class:`FakeHost`), which records the batches it is given and
says ``BatchDone`` only when the test does. So a backlog builds up exactly where the
test wants it, and what the front does with it is observable without any timing.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pykka
import pytest
import zmq

from tests.wait import wait_for
from uniun.actors.scheduler.crash_marker import HEADER, SLOT_BYTES, CrashMarker, fingerprint
from uniun.actors.scheduler.front import RAW_CAP, FrontActor
from uniun.actors.scheduler.front_messages import (
    BatchDone,
    ClientBatch,
    ClientGone,
    FrontDepth,
    OpenFront,
    Outgoing,
)
from uniun.actors.socket_pump import SLOW_CAP, SLOW_RATE
from uniun.protocol import messages as m
from uniun.protocol.codec import Limits
from uniun.protocol.requests import JobRules


class FakeHost(pykka.ThreadingActor):
    """Records what the front tells it; never answers by itself (a fake of the host)."""

    def __init__(self, batches: queue.Queue[ClientBatch], gone: queue.Queue[bytes]) -> None:
        super().__init__()
        self.batches, self.gone = batches, gone

    def on_receive(self, message: Any) -> None:
        if isinstance(message, ClientBatch):
            self.batches.put(message)
        elif isinstance(message, ClientGone):
            self.gone.put(message.conn)


class Front:
    """A started front, its fake host, and helpers to drive them."""

    def __init__(self, tmp: Path, **caps: int) -> None:
        self.ctx = zmq.Context()
        self.batches: queue.Queue[ClientBatch] = queue.Queue()
        self.gone: queue.Queue[bytes] = queue.Queue()
        self.host_ref = FakeHost.start(self.batches, self.gone)
        self.endpoint = f"ipc://{tmp / 'front.sock'}"
        self.ref = FrontActor.start(endpoint=self.endpoint, host=self.host_ref,
                                    rules=JobRules(default_model="tiny-1"),
                                    limits=Limits(), linger_ms=0, ctx=self.ctx, **caps)
        self.ref.ask(OpenFront(), timeout=10)
        self.clients: list[zmq.Socket] = []

    def client(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(self.endpoint)
        self.clients.append(sock)
        return sock

    def depth(self) -> dict[str, int]:
        return self.ref.ask(FrontDepth(), timeout=10)

    def next_batch(self) -> list[tuple[bytes, str]]:
        """The next batch the host gets, as (connection, request id) pairs."""
        batch = self.batches.get(timeout=60)
        return [(r.conn, r.request.id) for r in batch.requests]

    def done(self) -> None:
        self.ref.tell(BatchDone())

    def close(self) -> None:
        for sock in self.clients:
            sock.close(0)
        pykka.ActorRegistry.stop_all(timeout=10)
        self.ctx.destroy(linger=0)


@pytest.fixture
def front_factory(tmp_path: Path) -> Iterator[Any]:
    made: list[Front] = []

    def make(**caps: int) -> Front:
        made.append(Front(tmp_path, **caps))
        return made[-1]

    yield make
    for front in made:
        front.close()


def send_status(sock: zmq.Socket, ids: range | list[int], tag: str) -> None:
    for i in ids:
        sock.send(msgpack.packb({"v": 1, "type": "status", "id": f"{tag}-{i}"}))


def test_a_client_behind_a_flood_is_served_in_the_next_batch(front_factory: Any) -> None:
    front = front_factory()
    a, b = front.client(), front.client()
    send_status(a, range(300), "a")
    first = front.next_batch()  # the host holds it: the rest of the flood waits
    wait_for("the flood in the front", lambda: front.depth()["pending"] == 300 - len(first))
    send_status(b, [0], "b")
    wait_for("b's request in the front", lambda: front.depth()["pending"] == 301 - len(first))
    front.done()
    second = [rid for _, rid in front.next_batch()]
    assert "b-0" in second[:2], f"b waited behind the flood: {second[:5]}"


def test_a_connection_over_its_cap_is_refused_with_a_retry_hint(front_factory: Any) -> None:
    front = front_factory(conn_pending_cap=10)
    a = front.client()
    send_status(a, range(100), "a")
    taken = len(front.next_batch())
    assert taken <= 10
    # Until each of the 100 is with the host, pending or refused: "nothing left to decode"
    # alone can hold while frames are still on their way (and those may go to pending).
    refused: list[dict[str, Any]] = []

    def settled() -> dict[str, int] | None:
        while a.poll(0):
            refused.append(msgpack.unpackb(a.recv(), raw=False))
        d = front.depth()
        return d if d["read"] == 0 and taken + d["pending"] + len(refused) == 100 else None

    depth = wait_for("every request of a taken, pending or refused", settled)
    assert depth["pending"] <= 10
    assert {r["code"] for r in refused} == {"queue_full"}
    assert all(r["retryable"] is True and r["retry_after_s"] > 0 for r in refused)
    assert len({r["re"] for r in refused}) == len(refused)  # each request answered once
    assert a.poll(200) == 0  # what is pending or with the host is not refused


def test_at_the_total_cap_the_front_stops_reading_and_resumes_fairly(
        front_factory: Any) -> None:
    front = front_factory(conn_pending_cap=1000, pending_cap=20, raw_cap=8)
    a, b = front.client(), front.client()
    send_status(a, range(500), "a")
    taken = len(front.next_batch())
    depth = wait_for("the front at its caps", lambda: (d := front.depth())["pending"] == 20
                     and 0 < d["read"] <= 8 and d)
    # The rest of the flood was not copied into the scheduler: ZeroMQ holds it.
    assert taken + depth["pending"] + depth["read"] < 500
    send_status(b, [0], "b")
    seen = taken
    for _ in range(6):
        front.done()
        batch = [rid for _, rid in front.next_batch()]
        if "b-0" in batch:
            break
        seen += len(batch)
    else:
        pytest.fail("b's request did not come within six batches of the flood")
    assert seen < 100, "b's request was read only after most of the flood"


def test_a_client_that_went_away_has_its_status_requests_dropped(front_factory: Any) -> None:
    front = front_factory()
    a = front.client()
    send_status(a, range(300), "a")
    first = front.next_batch()
    wait_for("the flood in the front", lambda: front.depth()["pending"] == 300 - len(first))
    a.close(0)
    front.clients.remove(a)
    conn = first[0][0]

    def gone() -> bool:  # a reply to it finds no route once its connection is closed
        front.ref.tell(Outgoing(conn, m.reply_pong("x")))
        return front.depth()["muted"] == 1

    wait_for("the front to notice the client is gone", gone)
    assert front.gone.get(timeout=60) == conn
    assert front.depth()["pending"] == 0
    front.done()
    assert front.batches.empty()


def test_a_client_that_does_not_read_is_read_slowly_and_others_keep_their_turn(
        front_factory: Any) -> None:
    """Once a client's replies cannot reach it (its queue is full: it does not read),
    its requests are read in vain: dropped, and at a bounded rate (an upper bound on
    the front's work, whatever the machine's speed), while another client's request
    still comes in its turn."""
    front = front_factory(sndhwm=4)
    a = front.client()
    a.setsockopt(zmq.RCVHWM, 1)
    b = front.client()
    send_status(a, [0], "a")
    conn = front.next_batch()[0][0]
    front.done()

    def congested() -> bool:  # replies to it pile up until a send finds its queue full
        for _ in range(64):
            front.ref.tell(Outgoing(conn, m.reply_pong("x")))
        return front.depth()["muted"] == 1

    wait_for("the front to find a's replies cannot reach it", congested)
    flood = 20_000  # seconds of reading at the bounded rate
    started = time.monotonic()
    send_status(a, range(1, flood + 1), "a")
    wait_for("a's flood being read in vain", lambda: front.depth()["in_vain"] > 0)
    send_status(b, [0], "b")
    for _ in range(20):
        batch = [rid for _, rid in front.next_batch()]
        front.done()
        if "b-0" in batch:
            break
    else:
        pytest.fail("b's request did not come within 20 batches")
    read_in_vain = front.depth()["in_vain"]
    bound = RAW_CAP + SLOW_CAP + SLOW_RATE * (time.monotonic() - started)
    assert read_in_vain <= bound, f"{read_in_vain} frames read in vain, at most {bound:.0f}"


def test_a_submit_the_scheduler_died_validating_twice_is_answered_poisoned_unvalidated(
        front_factory: Any, tmp_path: Path) -> None:
    job = {"job_id": "p", "kind": "chat", "prompt": "hi", "format": {"type": "json_object"}}
    poisoned = {"v": 1, "type": "submit", "id": "p-1", "job": job}
    path = tmp_path / "crash-marker"  # as a scheduler leaves it after two such deaths
    path.write_bytes(HEADER + b"inflight - -".ljust(SLOT_BYTES - 1) + b"\n"
                     + f"{fingerprint(poisoned)} 2 0\n".encode())
    front = front_factory(crash_marker=CrashMarker(path))
    a = front.client()
    a.send(msgpack.packb(poisoned))
    assert a.poll(60_000)
    reply = msgpack.unpackb(a.recv(), raw=False)
    assert (reply["code"], reply["re"], reply["retryable"]) == ("poisoned", "p-1", False)
    other = {"v": 1, "type": "submit", "id": "p-2", "job": dict(job, prompt="hello")}
    a.send(msgpack.packb(other))
    assert [rid for _, rid in front.next_batch()] == ["p-2"]  # validated and passed on
