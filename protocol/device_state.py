"""The device-state signal: "interactive work is in flight", from the scheduler to the
processes that compute outside the runner (docs/device.md).

Why a PUB socket: the signal is one-way and lossy by nature (only the latest value
matters), the scheduler must never wait for or know about its listeners, and a listener
that starts late or misses a message must still get the truth. So the scheduler
*publishes* a tiny record on every change and re-publishes the current one every
``REPUBLISH_S``; a listener keeps the latest record it heard. A listener that hears
nothing for ``STALE_S`` (scheduler gone or restarting) treats the device as free, so a
dead scheduler can never freeze background work.

Wire: one frame, msgpack ``{"v": 1, "interactive": bool, "seq": int}``; ``seq`` grows on
every change (not on a re-publish), so a listener can tell a change from a repeat.
The endpoint is ``ipc://$UNIUN_HOME/run/device.sock`` (:func:`device_endpoint`).

Two listeners, one interface (``wait_heard``, ``interactive``, ``wait_turn``, ``close``):

- :class:`YieldGate`: a thread owns the SUB socket and keeps the latest state, so any
  thread may ask. It is only as current as that thread is scheduled: in a process at
  idle CPU priority it may not run for as long as other processes hold every core.
- :class:`PolledGate`: no thread; the caller's own thread reads the socket (every record
  queued since the last look, keeping the latest) each time it asks. What it answers is
  the latest record the process has received when the question is asked, because the
  thread that asks is the thread that is about to compute. The embedding workers use it
  before each micro-batch.

:meth:`wait_turn` blocks while interactive work is in flight and returns how long it
waited. It never refuses and never gives up on a request: the caller's work only starts
later.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import msgpack
import zmq

from uniun.protocol.home import run_dir

__all__ = [
    "REPUBLISH_S",
    "STALE_S",
    "DeviceState",
    "PolledGate",
    "YieldGate",
    "decode_state",
    "device_endpoint",
    "encode_state",
]

REPUBLISH_S = 0.5  # the publisher repeats the current state this often, s
STALE_S = 3.0  # a listener that heard nothing this long treats the device as free, s


@dataclass(frozen=True)
class DeviceState:
    interactive: bool
    seq: int


def encode_state(state: DeviceState) -> bytes:
    return msgpack.packb({"v": 1, "interactive": bool(state.interactive),
                          "seq": int(state.seq)}, use_bin_type=True)


def decode_state(frame: bytes) -> DeviceState | None:
    """The record in ``frame``, or None for anything that is not one (ignored)."""
    try:
        raw = msgpack.unpackb(frame, raw=False, max_bin_len=64, max_str_len=64,
                              max_map_len=8, max_array_len=0)
    except Exception:  # noqa: BLE001 - any undecodable frame is ignored, whatever the error
        return None
    if (not isinstance(raw, dict) or raw.get("v") != 1
            or not isinstance(raw.get("interactive"), bool)
            or not isinstance(raw.get("seq"), int) or isinstance(raw.get("seq"), bool)):
        return None
    return DeviceState(raw["interactive"], raw["seq"])


def device_endpoint() -> str:
    """``ipc://$UNIUN_HOME/run/device.sock`` (resolved at call time)."""
    return f"ipc://{run_dir() / 'device.sock'}"


class _GateState:
    """What both gates know: the last state heard, when, and how long callers waited."""

    def __init__(self, endpoint: str | None, stale_s: float) -> None:
        self.endpoint = endpoint
        self.stale_s = stale_s
        self._interactive = False
        self._heard_at = 0.0
        self.last_seq = -1
        self.waits = 0  # calls of wait_turn that had to wait
        self.waited_s = 0.0  # their total wait, s

    def _closed(self, now: float) -> bool:
        return self._interactive and now - self._heard_at < self.stale_s

    def _waited(self, started: float) -> float:
        """Count a wait_turn call that began at ``started``; its wait in seconds."""
        waited = time.monotonic() - started
        if waited > 0.001:
            self.waits += 1
            self.waited_s += waited
        return waited


class YieldGate(_GateState):
    """A listener of the device state (see the module docstring).

    ``YieldGate(None)`` is a gate that never closes (the signal switched off).
    """

    def __init__(self, endpoint: str | None, *, stale_s: float = STALE_S,
                 ctx: zmq.Context | None = None) -> None:
        super().__init__(endpoint, stale_s)
        self._cond = threading.Condition()
        self._heard = threading.Event()
        self._stop = threading.Event()
        self._ctx = ctx or zmq.Context.instance()
        self._thread: threading.Thread | None = None
        if endpoint:
            self._thread = threading.Thread(target=self._listen, name="yield-gate",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)

    def wait_heard(self, timeout: float = STALE_S) -> bool:
        """Wait until the first state arrived (a late joiner's catch-up; the publisher
        repeats itself every ``REPUBLISH_S``); False if none came (no scheduler yet)."""
        return self._thread is None or self._heard.wait(timeout)

    @property
    def interactive(self) -> bool:
        """Interactive work is in flight now, as last heard (False once stale)."""
        with self._cond:
            return self._closed(time.monotonic())

    def wait_turn(self, stop: threading.Event | None = None) -> float:
        """Block while interactive work is in flight; return the seconds waited."""
        started = time.monotonic()
        with self._cond:
            while self._closed(time.monotonic()) and not (stop and stop.is_set()):
                self._cond.wait(0.1)
        return self._waited(started)

    def wait_change(self, last: bool, timeout: float) -> bool:
        """Block until ``interactive`` differs from ``last``, or ``timeout`` seconds;
        return it (woken by every record, so a change is seen as soon as it is heard)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                state = self._closed(now)
                if state != last or now >= deadline:
                    return state
                self._cond.wait(min(0.1, deadline - now))

    def _listen(self) -> None:
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 64)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(self.endpoint)
        try:
            while not self._stop.is_set():
                if not sock.poll(200):
                    with self._cond:
                        self._cond.notify_all()  # lets waiters re-check staleness
                    continue
                state = decode_state(sock.recv())
                if state is None:
                    continue
                with self._cond:
                    self._interactive = state.interactive
                    self._heard_at = time.monotonic()
                    self.last_seq = state.seq
                    self._cond.notify_all()
                self._heard.set()
        finally:
            sock.close(0)


class PolledGate(_GateState):
    """A listener read by the thread that asks (see the module docstring).

    Not thread-safe: the thread that creates it is the only one that may call it (a
    ZeroMQ socket belongs to one thread). ``PolledGate(None)`` never closes. The SUB
    socket keeps one record at most (``CONFLATE``): only the latest state matters, so a
    worker that was busy for seconds reads one record, not every republish since.
    """

    def __init__(self, endpoint: str | None, *, stale_s: float = STALE_S,
                 ctx: zmq.Context | None = None) -> None:
        super().__init__(endpoint, stale_s)
        self.heard = False
        self._sock: zmq.Socket | None = None
        if endpoint:
            sock = (ctx or zmq.Context.instance()).socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.CONFLATE, 1)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(endpoint)
            self._sock = sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None

    def wait_heard(self, timeout: float = STALE_S) -> bool:
        """Wait until the first state arrived; False if none came within ``timeout``."""
        if self._sock is None:
            return True
        deadline = time.monotonic() + timeout
        self._read()
        while not self.heard:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._sock.poll(min(100, max(1, int(left * 1000))))
            self._read()
        return True

    @property
    def interactive(self) -> bool:
        """Interactive work is in flight now, as last received (False once stale)."""
        self._read()
        return self._closed(time.monotonic())

    def wait_turn(self, stop: threading.Event | None = None) -> float:
        """Block while interactive work is in flight; return the seconds waited."""
        started = time.monotonic()
        self._read()
        while self._closed(time.monotonic()) and not (stop and stop.is_set()):
            assert self._sock is not None  # _closed is False without a socket
            left_fresh = self.stale_s - (time.monotonic() - self._heard_at)
            self._sock.poll(max(1, min(100, int(left_fresh * 1000) + 1)))
            self._read()
        return self._waited(started)

    def _read(self) -> bool:
        """Take every record received so far, keep the latest; True if any came."""
        got = False
        while self._sock is not None:
            try:
                frame = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            state = decode_state(frame)
            if state is None:
                continue
            self._interactive, self.last_seq = state.interactive, state.seq
            self._heard_at, self.heard, got = time.monotonic(), True, True
        return got
