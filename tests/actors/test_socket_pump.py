"""The socket pump's backlog signal: what the scheduler's front reads a burst by."""

from __future__ import annotations

import threading

import zmq

from uniun.actors.socket_pump import READ_BURST, SocketPump


def test_a_burst_beyond_one_read_raises_the_backlog_until_the_pump_caught_up() -> None:
    ctx = zmq.Context()
    endpoint = "inproc://pump-backlog-test"
    got: list[list[bytes]] = []
    backlog_seen: list[bool] = []
    caught_up = threading.Event()
    pump: SocketPump | None = None

    def on_frames(frames: list[bytes]) -> None:
        got.append(frames)
        assert pump is not None
        backlog_seen.append(pump.backlog)

    def make(c: zmq.Context) -> zmq.Socket:
        sock = c.socket(zmq.PULL)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.bind(endpoint)
        return sock

    sender = ctx.socket(zmq.PUSH)
    sender.setsockopt(zmq.SNDHWM, 0)
    try:
        pump = SocketPump("test", ctx, make, on_frames, on_caught_up=caught_up.set)
        sender.connect(endpoint)
        total = READ_BURST * 3 + 7
        for i in range(total):  # queued before the pump binds and reads any of it
            sender.send(str(i).encode())
        pump.start()
        assert caught_up.wait(10.0), "the pump never reported catching up"
        assert [f[0] for f in got] == [str(i).encode() for i in range(total)]
        assert any(backlog_seen), "frames read behind a full read were not flagged"
        assert pump.backlog is False
    finally:
        if pump is not None:
            pump.stop()
        sender.close(0)
        ctx.term()
