"""The socket options both ends of the scheduler<->runner link share.

Both ends are ours and sit on one machine, so the link never waits on the network; what
must not happen is a peer's queue silently dropping a report or a command. A queue of
``RUNNER_HWM`` messages holds a 4096-token job's whole stream several times over, so a
slow reader never loses a token; a bigger backlog means the peer is gone, and the
liveness rule notices that instead.
"""

from __future__ import annotations

import zmq

__all__ = ["runner_socket", "RUNNER_HWM"]

RUNNER_HWM = 100_000  # messages queued per direction before zmq refuses more


def runner_socket(ctx: zmq.Context, kind: int) -> zmq.Socket:
    """A ROUTER (scheduler) or DEALER (runner) socket for the runner link."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)  # a stopped link's unsent messages are stale anyway
    sock.setsockopt(zmq.SNDHWM, RUNNER_HWM)
    sock.setsockopt(zmq.RCVHWM, RUNNER_HWM)
    return sock
