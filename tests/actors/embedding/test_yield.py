"""An embedding worker yields to interactive work: while the scheduler says a chat is in
flight it starts no new batch; the request waits (never refused) and is answered after.

The worker is the product's ``serve()`` with its real socket and its real listener of
the scheduler's real publisher; only the ONNX session is a fake that records what the
device state was when each batch started.
"""

from __future__ import annotations

import threading
import time

import msgpack
import numpy as np
import zmq

from tests.wait import wait_for
from uniun.actors.embedding.worker import serve
from uniun.actors.scheduler.device_signal import DevicePublisher
from uniun.protocol.device_state import YieldGate


class FakeSession:
    """Records, per batch, whether a chat ran when it started; one batch per text."""

    dim = 4

    def __init__(self, chat_running: list[bool]) -> None:
        self.chat_running = chat_running
        self.starts: list[bool] = []
        self.on_batch: list = []  # callbacks run at the start of batch i

    def embed(self, texts, before_batch=None):
        for i, _ in enumerate(texts):
            if before_batch is not None:
                before_batch()
            self.starts.append(self.chat_running[0])
            if i < len(self.on_batch):
                self.on_batch[i]()
        return np.zeros((len(texts), self.dim), dtype=np.float32)


def _worker(tmp_path, session, endpoint):
    ctx = zmq.Context.instance()
    back = ctx.socket(zmq.ROUTER)
    back.setsockopt(zmq.LINGER, 0)
    back_ep = f"ipc://{tmp_path / 'back.sock'}"
    back.bind(back_ep)
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=("embed-t", b"embed-t.1", back_ep, tmp_path),
                              kwargs={"stop": stop, "device_state": endpoint,
                                      "session": session}, daemon=True)
    thread.start()
    assert back.poll(60_000), "the worker never said ready"
    _, frame = back.recv_multipart()
    assert msgpack.unpackb(frame)["type"] == "ready"
    return back, stop, thread


def _work(back, rid: int, texts: list[str]) -> None:
    back.send_multipart([b"embed-t.1", msgpack.packb({"type": "work", "rid": rid,
                                                      "texts": texts})])


def _result(back, progress: list | None = None) -> dict:
    """The next result; the progress messages before it go to ``progress``."""
    while True:
        assert back.poll(60_000), "no result"
        msg = msgpack.unpackb(back.recv_multipart()[1])
        if msg["type"] != "progress":
            return msg
        if progress is not None:
            progress.append(msg)


def test_a_request_accepted_during_a_chat_starts_after_it(tmp_path) -> None:
    ctx = zmq.Context.instance()
    pub = DevicePublisher(f"ipc://{tmp_path / 'device.sock'}", ctx, republish_s=0.1)
    pub.start()
    chat_running = [True]
    pub.set(True)  # a chat is in flight before the worker starts (a late joiner)
    session = FakeSession(chat_running)
    back, stop, thread = _worker(tmp_path, session, pub.endpoint)
    try:
        _work(back, 1, ["a", "b"])
        time.sleep(0.5)  # room for a worker that does not yield to start (and be caught)
        chat_running[0] = False
        pub.set(False)  # the chat ended
        progress: list = []
        got = _result(back, progress)
        assert got["type"] == "result" and got["rid"] == 1
        assert session.starts == [False, False]  # no batch started while the chat ran
        assert got["waited_s"] > 0  # and its wait is reported
        assert (got["batches"], got["pauses"], got["pauses_within"]) == (2, 1, 0)
        assert {"rid": 1, "batches_done": 0, "paused": True, "type": "progress"} in progress
    finally:
        stop.set()
        thread.join(10)
        back.close(0)
        pub.close()


def test_the_running_batch_is_the_last_until_the_chat_ends(tmp_path) -> None:
    ctx = zmq.Context.instance()
    pub = DevicePublisher(f"ipc://{tmp_path / 'device.sock'}", ctx, republish_s=0.1)
    pub.start()
    listener = YieldGate(pub.endpoint, ctx=ctx)
    chat_running = [False]
    session = FakeSession(chat_running)

    announced = threading.Event()

    def chat_arrives() -> None:  # during the first batch of a three-batch request
        chat_running[0] = True
        pub.set(True)
        wait_for("the chat is announced", lambda: listener.interactive)
        time.sleep(1.0)  # the worker's own listener hears it too (republished every 0.1 s)
        announced.set()

    session.on_batch = [chat_arrives]
    back, stop, thread = _worker(tmp_path, session, pub.endpoint)
    try:
        _work(back, 7, ["a", "b", "c"])
        assert announced.wait(60), "the first batch never ran"
        time.sleep(0.5)  # room for a worker that does not yield to run on (and be caught)
        assert len(session.starts) == 1
        chat_running[0] = False
        pub.set(False)
        progress: list = []
        got = _result(back, progress)
        assert got["rid"] == 7 and session.starts == [False, False, False]
        # It paused after the first of its three batches, and told the pool so.
        assert (got["batches"], got["pauses"], got["pauses_within"]) == (3, 1, 1)
        assert [(p["batches_done"], p["paused"]) for p in progress] == [
            (1, False), (1, True), (2, False)]
    finally:
        stop.set()
        thread.join(10)
        back.close(0)
        listener.close()
        pub.close()
