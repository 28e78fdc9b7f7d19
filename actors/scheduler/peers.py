"""Which clients the front should not build replies for (pure, clock-injected).

Why: a reply is worth building only if it can reach its client. Two kinds cannot:

- **gone**: a send found no route (ROUTER_MANDATORY's ``EHOSTUNREACH``): the connection
  closed. It stays muted until a frame arrives from it again (a client that sets its own
  routing id may come back under it).
- **congested**: a send found the client's reply queue full (``EAGAIN`` at ``SNDHWM``):
  it does not read. For ``congested_s`` its replies would be dropped by ZeroMQ anyway,
  so they are not built; after that one is tried again.

A flooding client that never reads therefore costs the front a decode per request, not
a reply, and such requests are read at a bounded rate (``SocketPump.release_slowly``).
At most ``remember`` clients are remembered, the oldest forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

__all__ = ["MutedPeers"]

GONE = float("inf")


class MutedPeers:
    """See the module docstring."""

    def __init__(self, clock: Callable[[], float], *, remember: int = 4096,
                 congested_s: float = 1.0) -> None:
        self._clock = clock
        self._remember = remember
        self._congested_s = congested_s
        self._until: OrderedDict[bytes, float] = OrderedDict()  # conn -> muted until

    def __len__(self) -> int:
        return len(self._until)

    def gone(self, conn: bytes) -> bool:
        """Mark ``conn`` gone; True when it was not already."""
        if self._until.get(conn) == GONE:
            return False
        self._mark(conn, GONE)
        return True

    def congested(self, conn: bytes) -> None:
        if self._until.get(conn) != GONE:
            self._mark(conn, self._clock() + self._congested_s)

    def heard_from(self, conn: bytes) -> None:
        """A frame came from ``conn``: if it was gone, it is back (congestion stays)."""
        if self._until and self._until.get(conn) == GONE:
            del self._until[conn]

    def muted(self, conn: bytes) -> bool:
        until = self._until.get(conn) if self._until else None
        if until is None:
            return False
        if until != GONE and self._clock() >= until:
            del self._until[conn]
            return False
        return True

    def _mark(self, conn: bytes, until: float) -> None:
        self._until[conn] = until
        self._until.move_to_end(conn)
        if len(self._until) > self._remember:
            self._until.popitem(last=False)
