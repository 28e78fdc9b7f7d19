"""Heartbeats from every child process to the supervisor, over ZeroMQ.

Theory of operation (the ZeroMQ guide's Paranoid Pirate liveness, one direction only):
the supervisor binds a PULL socket at ``ipc://<run dir>/supervisor.sock``; each child
connects a PUSH socket and sends one small msgpack map per interval from a daemon thread.
The supervisor declares a child dead when nothing arrived for ``missed`` intervals
(default 3) and restarts it. A heartbeat carries the child's pid, so a late beat from a
killed incarnation can never vouch for its replacement.

A thread that beats no matter what would only prove the process exists. A child whose
main loop can hang passes ``healthy``: a callable the thread asks before every beat (for
instance "my loop ticked within the last N seconds"); while it says False, no beats go
out and the supervisor will restart the child. Sends never block: with no supervisor
listening, beats are dropped.

A child about to hold the GIL for seconds (the runner loading a model) calls
:meth:`HeartbeatSender.announce_quiet` first: one beat goes out at once carrying
``quiet_s``, and the supervisor allows that much more silence after it
(``protocol/liveness.py``). Ordinary beats during that time do not end it early.

Children learn the endpoint from ``UNIUN_SUPERVISOR_ENDPOINT`` (set by the supervisor).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack
import zmq
from loguru import logger

from uniun.protocol.liveness import Liveness

ENDPOINT_ENV = "UNIUN_SUPERVISOR_ENDPOINT"
MAX_BEAT_BYTES = 512  # a heartbeat is tiny; anything larger is not one of ours
RETRY_S = 0.02  # a beat that found no connection is tried again this soon, then doubling


def supervisor_endpoint(run_dir: Path) -> str:
    """Where the supervisor listens for heartbeats."""
    return f"ipc://{run_dir / 'supervisor.sock'}"


@dataclass(frozen=True)
class Beat:
    """One heartbeat as the supervisor sees it."""

    name: str
    pid: int
    at: float  # time.monotonic() on the supervisor when it arrived
    quiet_s: float = 0.0  # the child announces this long without beats to come


class HeartbeatSender:
    """Sends ``{"type": "heartbeat", "name", "pid"}`` every ``interval_s`` from a thread."""

    def __init__(self, name: str, *, endpoint: str | None = None, interval_s: float = 1.0,
                 healthy: Callable[[], bool] | None = None) -> None:
        self.name = name
        self.endpoint = endpoint or os.environ.get(ENDPOINT_ENV, "")
        self.interval_s = interval_s
        self.healthy = healthy
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._sent = threading.Event()  # the announced quiet beat has left
        self._quiet_s = 0.0  # set by announce_quiet, sent and cleared by the thread
        self._thread: threading.Thread | None = None

    def start(self) -> HeartbeatSender:
        """Start beating (a no-op without an endpoint, e.g. a process run by hand)."""
        if not self.endpoint:
            logger.debug("no supervisor endpoint; heartbeats off")
            return self
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self.name}",
                                        daemon=True)
        self._thread.start()
        return self

    def announce_quiet(self, seconds: float, wait_s: float = 1.0) -> bool:
        """Send one beat now saying "no beats for up to ``seconds``", and wait (at most
        ``wait_s``) until it has left; False if it could not be sent (no supervisor)."""
        if self._thread is None or not self._thread.is_alive():
            return False
        self._sent.clear()
        self._quiet_s = max(0.0, float(seconds))
        self._wake.set()
        return self._sent.wait(wait_s)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 4)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.connect(self.endpoint)
        beat = {"v": 1, "type": "heartbeat", "name": self.name, "pid": os.getpid()}
        payload = msgpack.packb(beat)
        retry_s = RETRY_S
        try:
            while not self._stop.is_set():
                quiet, self._quiet_s = self._quiet_s, 0.0
                wait_s = self.interval_s
                if self._is_healthy():
                    try:
                        sock.send(msgpack.packb({**beat, "quiet_s": quiet}) if quiet
                                  else payload, zmq.NOBLOCK)
                        if quiet:
                            self._sent.set()
                        retry_s = RETRY_S
                    except zmq.Again:
                        # Not connected yet (IMMEDIATE: connect is asynchronous, so the
                        # first beat of every process lands here). Try again soon rather
                        # than a whole interval later: the supervisor starts the next
                        # child only on this child's first beat. Doubling, so a gone
                        # supervisor is not polled 50 times a second.
                        self._quiet_s = max(self._quiet_s, quiet)
                        wait_s = min(retry_s, self.interval_s)
                        retry_s *= 2
                self._wake.wait(wait_s)
                self._wake.clear()
        finally:
            sock.close(0)
            ctx.term()

    def _is_healthy(self) -> bool:
        if self.healthy is None:
            return True
        try:
            return bool(self.healthy())
        except Exception:  # a broken health check means "not healthy"
            logger.exception("health check failed")
            return False


class HeartbeatMonitor:
    """The supervisor's end: a bound PULL socket and the last beat of each child."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_BEAT_BYTES)
        self._sock.bind(endpoint)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)

    def poll(self, timeout_s: float) -> Iterator[Beat]:
        """Wait up to ``timeout_s`` for beats and yield every one that arrived."""
        events = dict(self._poller.poll(int(timeout_s * 1000)))
        if self._sock not in events:
            return
        while True:
            try:
                raw = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            beat = _parse(raw)
            if beat is not None:
                yield beat

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()


def _parse(raw: bytes) -> Beat | None:
    try:
        msg = msgpack.unpackb(raw, raw=False, strict_map_key=True)  # MAXMSGSIZE bounds it
    except Exception:  # noqa: BLE001 - anything undecodable is not a beat
        return None
    if not isinstance(msg, dict) or msg.get("type") != "heartbeat":
        return None
    name, pid = msg.get("name"), msg.get("pid")
    if not isinstance(name, str) or not isinstance(pid, int) or isinstance(pid, bool):
        return None
    at = time.monotonic()
    return Beat(name=name, pid=pid, at=at,
                quiet_s=Liveness.heard(at, msg.get("quiet_s", 0.0)) - at)
