"""The DEALER socket every client of ours connects with, and its connection monitor.

Both the front client and the embedding client need the same socket: ``IMMEDIATE`` so
nothing is queued for a peer that is not there, a capped reconnect back-off, a bounded
``LINGER``, and a monitor socket that tells them when the handshake happened or the peer
went away (which is how they notice a lost scheduler or pool without waiting out a
timeout). One place, so the two cannot drift apart.
"""

from __future__ import annotations

import zmq

RECONNECT_IVL_MS = 100  # first reconnect attempt after 100 ms ...
RECONNECT_IVL_MAX_MS = 2000  # ... doubling up to 2 s


def open_monitored_dealer(ctx: zmq.Context, endpoint: str, *, linger_ms: int, events: int,
                          send_timeout_ms: int | None = None) -> tuple[zmq.Socket, zmq.Socket]:
    """A connected DEALER and the PAIR socket that receives its monitor ``events``."""
    sock = ctx.socket(zmq.DEALER)
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
    try:
        sock.disable_monitor()
    except zmq.ZMQError:
        pass
    if monitor is not None:
        monitor.close(linger=0)
    sock.close(linger=linger_ms)
