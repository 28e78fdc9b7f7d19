"""The embedding pool's waiting line: one FIFO per connection, taken round-robin.

Why not one FIFO: a client that keeps many requests queued would get every worker turn
until its backlog drains, and another client's single request would wait behind all of
it. Here each connection with something waiting gets one turn per round (the ZeroMQ
guide's fair-queuing of clients), so a flooding connection gets its share of the
workers and no more, and its backlog delays nobody else by more than one request per
round.

What one connection may have waiting is capped (``per_client``), and so is the total
(``bound``), so a client cannot fill the whole line and shut every other one out.

Pure: no sockets, no clock; the pool (``pool.py``) decides what a refusal means on the
wire. Every operation is O(1) except :meth:`drop`, which is O(requests of that peer).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["FairQueue", "Refusal"]

T = TypeVar("T")


@dataclass(frozen=True)
class Refusal:
    """Why a request was not queued: ``"client"`` (its connection is at its cap) or
    ``"total"`` (the line is full); ``waiting`` is what that limit counted."""

    limit: str
    waiting: int


class FairQueue(Generic[T]):
    """Requests of many connections; :meth:`pop` takes them round-robin by connection.

    ``bound``: requests waiting at most, all connections together. ``per_client``:
    requests one connection may have waiting (0 = only the total bound applies).
    """

    def __init__(self, bound: int, per_client: int = 0) -> None:
        if bound < 0 or per_client < 0:
            raise ValueError("bound and per_client must be >= 0")
        self.bound = bound
        self.per_client = per_client
        self._lines: dict[Hashable, deque[T]] = {}
        self._ring: deque[Hashable] = deque()  # connections with something waiting, in turn
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[T]:
        """Every waiting request, connection by connection (for shutdown and status)."""
        for key in self._ring:
            yield from self._lines[key]

    @property
    def connections(self) -> int:
        """Connections with at least one request waiting."""
        return len(self._ring)

    def waiting(self, key: Hashable) -> int:
        line = self._lines.get(key)
        return len(line) if line is not None else 0

    def refusal(self, key: Hashable) -> Refusal | None:
        """Why one more request of ``key`` would be refused now, or None if it fits."""
        mine = self.waiting(key)
        if self.per_client and mine >= self.per_client:
            return Refusal("client", mine)
        if self._count >= self.bound:
            return Refusal("total", self._count)
        return None

    def push(self, key: Hashable, item: T) -> None:
        """Queue ``item`` last in its connection's line (the caller checked :meth:`refusal`)."""
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = deque()
            self._ring.append(key)
        line.append(item)
        self._count += 1

    def push_front(self, key: Hashable, item: T) -> None:
        """Put ``item`` back first in line, and its connection first in the round: a
        request whose worker died was already taken once and must not wait a round again.
        It may exceed the caps by that one request; it was admitted before."""
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = deque()
        else:
            self._ring.remove(key)
        line.appendleft(item)
        self._ring.appendleft(key)
        self._count += 1

    def pop(self) -> T:
        """The next request: the first of the connection whose turn it is. IndexError if
        nothing waits."""
        key = self._ring.popleft()
        line = self._lines[key]
        item = line.popleft()
        self._count -= 1
        if line:
            self._ring.append(key)  # its next request waits for the next round
        else:
            del self._lines[key]
        return item

    def drop(self, key: Hashable) -> list[T]:
        """Remove and return every request of ``key`` (its peer has gone)."""
        line = self._lines.pop(key, None)
        if line is None:
            return []
        self._ring.remove(key)
        self._count -= len(line)
        return list(line)
