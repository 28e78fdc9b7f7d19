"""The embedding pool as a door: fair to every connection, bounded per connection, and
out of the way of interactive work between micro-batches.

A real pool process (one worker, 2 texts per micro-batch, queue bound 8, 3 waiting per
connection) with the real model, over real sockets; only the device state comes from
the test (``held_pool``): while it says "interactive" the worker starts no micro-batch,
which lets a test stop the worker at a known point instead of racing it. Nothing here
asserts on timing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from tests.wait import wait_for
from uniun.protocol.client import ClientError
from uniun.protocol.embed_client import EmbedClient

pytestmark = pytest.mark.integration


def _texts(tag: str, n: int, words: int = 30) -> list[str]:
    return [f"{tag} item {i}: " + " ".join(f"w{(i * 7 + j) % 97}" for j in range(words))
            for i in range(n)]


LONG = 16  # texts of a request that must still be running when the test acts: 8 runs


@contextmanager
def _watch(pool: Any) -> Iterator[EmbedClient]:
    """One connection for the test's own status polls."""
    with pool.client() as client:
        yield client


def _worker(watcher: EmbedClient) -> dict:
    (worker,) = watcher.status()["workers"]
    return worker


def _paused_on(watcher: EmbedClient, msg_id: str) -> bool:
    worker = _worker(watcher)
    return worker["request"] == msg_id and worker["paused"]


@contextmanager
def _dealers(pool: Any, n: int) -> Iterator[list[zmq.Socket]]:
    """``n`` raw connections, so a test can read every reply in the order it arrives."""
    ctx = zmq.Context.instance()
    socks = [ctx.socket(zmq.DEALER) for _ in range(n)]
    try:
        for sock in socks:
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(pool.endpoint)
        yield socks
    finally:
        for sock in socks:
            sock.close(0)


def _send(sock: zmq.Socket, msg_id: str, texts: list[str]) -> None:
    sock.send(msgpack.packb({"v": 1, "type": "embed", "id": msg_id, "texts": texts}))


def _arrivals(socks: list[zmq.Socket], count: int) -> list[dict]:
    """The next ``count`` replies on any of ``socks``, in the order they arrive."""
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    replies: list[dict] = []
    while len(replies) < count:
        ready = dict(poller.poll(180_000))
        assert ready, f"only {len(replies)} of {count} replies came"
        for sock in socks:  # every ready socket has at most one reply: one worker
            if sock in ready:
                replies.append(msgpack.unpackb(sock.recv(), raw=False))
    return replies


def _idle(status: dict) -> bool:
    return status["queued"] == 0 and status["running"] == 0


def _rows(reply: dict) -> np.ndarray:
    assert reply["type"] == "embeddings", reply
    return np.frombuffer(b"".join(reply["vectors"]), dtype="<f4").reshape(-1, reply["dim"])


def test_two_connections_take_turns_instead_of_arrival_order(held_pool, session) -> None:
    sent: dict[str, list[str]] = {}
    with _watch(held_pool) as watcher, _dealers(held_pool, 2) as (flood, other):
        try:
            held_pool.hold()
            sent["a0"] = _texts("a0", LONG)
            _send(flood, "a0", sent["a0"])
            wait_for("the worker paused on a0", lambda: _paused_on(watcher, "a0"))
            for msg_id, sock in (("a1", flood), ("a2", flood), ("a3", flood),
                                 ("b0", other), ("b1", other)):
                sent[msg_id] = _texts(msg_id, 2)
                _send(sock, msg_id, sent[msg_id])
            wait_for("five requests waiting", lambda: watcher.status()["queued"] == 5)
            held_pool.release()
            replies = _arrivals([flood, other], 6)
        finally:
            held_pool.release()
    # Arrival order would be a1 a2 a3 b0 b1: the other connection gets every other turn.
    assert [r["re"] for r in replies] == ["a0", "a1", "b0", "a2", "b1", "a3"]
    for reply in replies:
        np.testing.assert_allclose(_rows(reply), session.embed(sent[reply["re"]]),
                                   rtol=0, atol=1e-6)


def test_one_connection_is_capped_and_told_when_to_retry(held_pool) -> None:
    with _watch(held_pool) as watcher, held_pool.client() as flood, \
            held_pool.client() as b, held_pool.client() as c:
        before = watcher.status()
        try:
            held_pool.hold()
            running = flood.submit(_texts("cap-running", LONG))
            wait_for("the worker paused", lambda: _paused_on(watcher, running))
            waiting = [flood.submit(_texts(f"cap{i}", 2)) for i in range(3)]  # its cap: 3
            over = flood.submit(_texts("cap-over", 2))
            refused = flood.wait([over])[over]
            assert isinstance(refused, ClientError) and refused.code == "queue_full"
            assert refused.retryable and "this connection" in refused.message
            assert isinstance(refused.retry_after_s, float)
            assert 0 < refused.retry_after_s <= 30
            # Others still get in, up to the total bound (8): 3 of b, 2 of c.
            others = [b.submit(_texts(f"b{i}", 2)) for i in range(3)]
            others_c = [c.submit(_texts(f"c{i}", 2)) for i in range(2)]
            full = c.submit(_texts("c-over", 2))
            refused_total = c.wait([full])[full]
            assert isinstance(refused_total, ClientError)
            assert refused_total.code == "queue_full" and "queue is full" in refused_total.message
            assert isinstance(refused_total.retry_after_s, float)
            held = watcher.status()
            assert held["queued"] == 8 and held["running"] == 1
            assert held["rejected_client"] - before["rejected_client"] == 1
            assert held["rejected_full"] - before["rejected_full"] == 2
            held_pool.release()
            results = {**flood.wait([running, *waiting]), **b.wait(others),
                       **c.wait(others_c)}
        finally:
            held_pool.release()
        after = watcher.status()
    assert all(isinstance(r, np.ndarray) for r in results.values()), results
    assert after["queued"] == 0 and after["answered"] - before["answered"] == 9


def test_a_micro_batched_request_equals_one_whole_batch(held_pool, minilm_dir) -> None:
    """The pool embeds 2 texts per ONNX run; in one process, one run of all 32. The graph
    masks padding, but a run padded to another width sums in another order, so rows may
    differ in their last float32 bits (a few 1e-8 measured); never more than 1e-6."""
    from uniun.models.embedding import EmbeddingSession

    texts = [f"text {i}: " + "word " * (3 + (i * 11) % 60) for i in range(32)]  # many widths
    whole = EmbeddingSession(minilm_dir, batch_size=32).embed(texts)
    with _watch(held_pool) as watcher:
        before = watcher.status()
        with held_pool.client() as client:
            got = client.embed(texts)
        after = watcher.status()
    assert after["micro_batches"] - before["micro_batches"] == 16  # 32 texts, 2 per run
    assert got.shape == whole.shape == (32, 384)
    np.testing.assert_allclose(got, whole, rtol=0, atol=1e-6)


def test_interactive_work_pauses_a_running_request_between_micro_batches(held_pool) -> None:
    texts = _texts("long", 64, words=150)  # 32 runs of 2 texts
    with _watch(held_pool) as watcher, held_pool.client() as client:
        before = watcher.status()
        try:
            msg_id = client.submit(texts)
            wait_for("the first micro-batch done",
                     lambda: (_worker(watcher)["batches_done"] or 0) >= 1, every=0.005)
            held_pool.hold()  # a chat arrives while the request runs
            wait_for("the worker paused", lambda: _paused_on(watcher, msg_id))
            done = _worker(watcher)["batches_done"]
            assert 0 < done < 32, "the pause came between two of the request's micro-batches"
            for _ in range(5):  # room for a worker that does not yield to go on (and be caught)
                time.sleep(0.1)
                worker = _worker(watcher)
                assert (worker["batches_done"], worker["paused"]) == (done, True)
            held_pool.release()  # the chat ended
            got = client.wait([msg_id])[msg_id]
        finally:
            held_pool.release()
        after = watcher.status()
    assert after["yield_pauses_within"] - before["yield_pauses_within"] >= 1
    assert after["micro_batches"] - before["micro_batches"] == 32
    assert after["yielded"] - before["yielded"] == 1
    assert isinstance(got, np.ndarray) and got.shape == (64, 384)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_requests_of_a_client_that_left_are_dropped_not_computed(held_pool) -> None:
    with _watch(held_pool) as watcher:
        before = watcher.status()
        try:
            with _dealers(held_pool, 1) as (gone,):
                held_pool.hold()
                _send(gone, "g0", _texts("g0", LONG))
                wait_for("the worker paused on g0", lambda: _paused_on(watcher, "g0"))
                for i in range(1, 4):
                    _send(gone, f"g{i}", _texts(f"g{i}", 2))
                wait_for("three requests waiting", lambda: watcher.status()["queued"] == 3)
            # The client has closed its socket: g0's reply has nowhere to go, and g1-g3
            # would be computed for nobody.
            held_pool.release()
            wait_for("the pool idle", lambda: _idle(watcher.status()))
        finally:
            held_pool.release()
        after = watcher.status()
        assert after["dropped_gone"] - before["dropped_gone"] == 3
        assert after["answered"] - before["answered"] == 1  # g0 only
        with held_pool.client() as client:  # and the pool serves the next client
            assert client.embed(["still serving"]).shape == (1, 384)
