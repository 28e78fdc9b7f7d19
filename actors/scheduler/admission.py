"""Whether one more job may join the scheduler's queue: bounds per class and per client (pure).

Why: ``limits.queue_cap`` alone lets one client's background submits fill the queue,
and then every chat, the one thing the runtime promises to answer at once, is refused
``queue_full``. So the cap is split:

- **the chat reserve**: ``chat_reserve_share`` of ``queue_cap`` (rounded up) only chats
  may take. Background jobs (every kind but the chat kind) fill at most the rest, the
  *background room*; a chat is refused only when ``queue_cap`` jobs are live, and at
  least the reserve of them are chats.
- **a client's share**: one client may hold at most ``client_share`` of the background
  room (rounded down, at least 1) in open background jobs, so one client's burst leaves
  room for the others'. A client is its CURVE key when it has one (every connection of a
  key counts together), else its connection (the ZeroMQ routing id). Chats do not count
  against it: they have the reserve.

**Whose chat it is** (:func:`chat_client`): the policy shares the runner between the
clients that chat (docs/scheduling.md, T0). A producer that serves many end clients (the
HTTP gateway: one pool of connections for every HTTP client) names the one it submits
for in the job's ``client`` field; the name is taken within the submitter's CURVE key, so
a key can split only its own share. Without a name, a client is its key or, failing
that, its connection, as for the queue's bounds.

"Open" is accepted and not ended. :class:`Occupancy` keeps the counts as jobs come and
go (the job table calls it), so a check costs O(1) whatever is queued.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

__all__ = ["CHAT_RESERVE_SHARE", "CLIENT_SHARE", "Holder", "Occupancy", "QueueBounds",
           "chat_client", "holder_of"]

CHAT_RESERVE_SHARE = 0.1  # of queue_cap, only chats may take (limits.chat_reserve_share)
CLIENT_SHARE = 0.5  # of the background room, one client may hold (limits.client_share)
_EPS = 1e-9  # 10000 * 0.1 must round to 1000, not 1001

Holder = bytes | str  # a connection's routing id, or a CURVE key


def holder_of(owner: str | None, conn: bytes | None) -> Holder | None:
    """Who a job counts against: its CURVE key, else its connection (None: neither, a
    job replayed from the journal without a key)."""
    return owner if owner is not None else conn


def chat_client(owner: str | None, conn: bytes | None, named: str) -> str:
    """The client a job is served for, as T0's fair shares key it (module docstring):
    ``named`` (the job's ``client`` field) within the CURVE key, else the key, else the
    connection; "" for a job replayed from the journal with none of them."""
    key = f"key {owner}" if owner is not None else ""
    if named:
        return f"{key} client {named}".lstrip()
    if key:
        return key
    return f"conn {conn.hex()}" if conn is not None else ""


@dataclass(frozen=True)
class QueueBounds:
    """The queue's bounds (module docstring). ``queue_cap``: live jobs at most."""

    queue_cap: int
    chat_reserve_share: float = CHAT_RESERVE_SHARE
    client_share: float = CLIENT_SHARE

    @property
    def chat_reserve(self) -> int:
        return min(self.queue_cap, math.ceil(self.queue_cap * self.chat_reserve_share - _EPS))

    @property
    def background_room(self) -> int:
        """Background jobs that may be live at once."""
        return self.queue_cap - self.chat_reserve

    @property
    def client_room(self) -> int:
        """Background jobs one client may have open at once."""
        return max(1, math.floor(self.background_room * self.client_share + _EPS))

    def refusal(self, *, chat: bool, live: int, background: int, held: int) -> str | None:
        """Why a new job may not be queued now (the ``queue_full`` message, naming the
        bound), or None. ``live``: jobs live; ``background``: of them, background ones;
        ``held``: the submitting client's open background jobs."""
        if live >= self.queue_cap:
            return (f"{live} jobs are waiting (limits.queue_cap is {self.queue_cap}); "
                    "retry later")
        if chat:
            return None
        if background >= self.background_room:
            return (f"{background} background jobs are waiting, all the queue takes: "
                    f"limits.queue_cap {self.queue_cap} less the chat reserve of "
                    f"{self.chat_reserve} (limits.chat_reserve_share); retry later")
        if held >= self.client_room:
            return (f"this client has {held} background jobs open, its share of the queue "
                    f"(limits.client_share of {self.background_room}); retry when some "
                    "have ended")
        return None


class Occupancy:
    """Open background jobs: in all, and per holder (chats are not counted)."""

    def __init__(self) -> None:
        self.background = 0
        self._held: Counter[Holder] = Counter()

    def held(self, holder: Holder | None) -> int:
        return 0 if holder is None else self._held[holder]

    def add(self, holder: Holder | None) -> None:
        """A background job of ``holder`` became live."""
        self.background += 1
        if holder is not None:
            self._held[holder] += 1

    def remove(self, holder: Holder | None) -> None:
        """A background job of ``holder`` ended (or was forgotten)."""
        self.background -= 1
        if holder is not None:
            self._held[holder] -= 1
            if self._held[holder] <= 0:
                del self._held[holder]  # a gone connection's id is not kept forever
