"""The DEALER connection every client of ours is built on, and its connection monitor.

Both the front client and the embedding client need the same socket: ``IMMEDIATE`` so
nothing is queued for a peer that is not there, a capped reconnect back-off, a bounded
``LINGER``, and a monitor socket that tells them when the handshake happened or the peer
went away (which is how they notice a lost scheduler or pool without waiting out a
timeout). :class:`DealerConnection` owns that socket, its message ids and its monitor, so
the two clients cannot drift apart; each adds only its own request/reply logic.
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from typing import TypeVar

import zmq
from zmq.utils.monitor import recv_monitor_message

from uniun.protocol.codec import DEFAULT_LIMITS, Limits
from uniun.protocol.curve import ClientCurve

__all__ = ["DealerConnection", "open_monitored_dealer", "close_monitored_dealer",
           "RECONNECT_IVL_MS", "RECONNECT_IVL_MAX_MS"]

RECONNECT_IVL_MS = 100  # first reconnect attempt after 100 ms ...
RECONNECT_IVL_MAX_MS = 2000  # ... doubling up to 2 s
# The handshake failures tell a client its key was refused (CURVE, docs/protocol.md)
# instead of leaving it to time out as if no server ran.
_AUTH_FAILED = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
MONITOR_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | _AUTH_FAILED

_C = TypeVar("_C", bound="DealerConnection")


def open_monitored_dealer(ctx: zmq.Context, endpoint: str, *, linger_ms: int, events: int,
                          send_timeout_ms: int | None = None,
                          curve: ClientCurve | None = None) -> tuple[zmq.Socket, zmq.Socket]:
    """A connected DEALER and the PAIR socket that receives its monitor ``events``."""
    sock = ctx.socket(zmq.DEALER)
    if curve is not None:
        curve.apply(sock)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
    if send_timeout_ms is not None:
        sock.setsockopt(zmq.SNDTIMEO, send_timeout_ms)
    monitor = sock.get_monitor_socket(events)
    sock.connect(endpoint)
    return sock, monitor


def close_monitored_dealer(sock: zmq.Socket, monitor: zmq.Socket | None, *,
                           linger_ms: int) -> None:
    """Stop the monitor, close both sockets (the DEALER with ``linger_ms``)."""
    with contextlib.suppress(zmq.ZMQError):
        sock.disable_monitor()
    if monitor is not None:
        monitor.close(linger=0)
    sock.close(linger=linger_ms)


class DealerConnection:
    """One monitored DEALER to one server; not thread-safe (use one per thread).

    Subclasses call :meth:`_poll` to wait for traffic: it updates ``_connected`` from the
    monitor (calling :meth:`_on_handshake` / :meth:`_on_disconnect`) and returns the
    one-frame messages that arrived. ``_open`` after ``_close_socket`` makes a fresh
    socket: a restarted server knows connections by identity and knows none.
    """

    def __init__(self, endpoint: str, *, linger_ms: int, limits: Limits = DEFAULT_LIMITS,
                 context: zmq.Context | None = None,
                 send_timeout_ms: int | None = None, curve: ClientCurve | None = None) -> None:
        self.endpoint = endpoint
        self._curve = curve  # CURVE keys for a tcp server that requires them
        self.refused: str | None = None  # why this socket's handshake failed, if it did
        self._linger_ms = linger_ms
        self._send_timeout_ms = send_timeout_ms
        self._limits = limits
        self._ctx = context or zmq.Context.instance()
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]
        self._sock: zmq.Socket | None = None
        self._mon: zmq.Socket | None = None
        self._poller = zmq.Poller()
        self._connected = False

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._close_socket()

    # -- the socket -------------------------------------------------------------------

    def _next_id(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    def _open(self) -> None:
        self._sock, self._mon = open_monitored_dealer(
            self._ctx, self.endpoint, linger_ms=self._linger_ms, events=MONITOR_EVENTS,
            send_timeout_ms=self._send_timeout_ms, curve=self._curve)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._mon, zmq.POLLIN)
        self._connected = False
        self.refused = None  # a fresh socket has not been refused (yet)

    def _close_socket(self) -> None:
        if self._sock is None:
            return
        close_monitored_dealer(self._sock, self._mon, linger_ms=self._linger_ms)
        self._sock = self._mon = None
        self._connected = False

    def _poll(self, timeout_s: float) -> list[list[bytes]]:
        """Wait up to ``timeout_s`` for traffic; return every message that arrived."""
        assert self._sock is not None and self._mon is not None
        ready = dict(self._poller.poll(max(0, int(timeout_s * 1000))))
        if self._mon in ready:
            self._read_monitor()
        received: list[list[bytes]] = []
        if self._sock in ready:
            while self._sock is not None:
                try:
                    received.append(self._sock.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
        return received

    def _read_monitor(self) -> None:
        assert self._mon is not None
        while True:
            try:
                event = recv_monitor_message(self._mon, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._connected, self.refused = True, None
                self._on_handshake()
            elif event["event"] & _AUTH_FAILED:
                self.refused = ("the server refused this client's key (not on its allow-list)"
                                if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH else
                                "the handshake failed: the server requires CURVE keys (or "
                                "this client sends keys the server does not expect)")
            elif event["event"] == zmq.EVENT_DISCONNECTED and self._connected:
                self._connected = False
                self._on_disconnect()

    def _on_handshake(self) -> None:
        """The server is there (first connection, or again after a reconnect)."""

    def _on_disconnect(self) -> None:
        """The server went away (killed, restarted, or its socket closed)."""
