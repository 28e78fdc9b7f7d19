"""The front's pending requests: fair across connections, bounded, control first (pure).

Why: the scheduler serves many clients through one ROUTER socket, and two kinds of
client can make everyone else wait. A producer that submits thousands of small
background jobs in a burst must not make a chat, a cancel or a status wait behind its
burst; and a client that floods the front (a bug, or another local program) must get
its share of the scheduler and no more. So :class:`FairInbox` keeps, per connection,
two FIFOs, and hands out batches like this:

- **control** first: every request but a submit, and the submits of interactive work
  (a chat, a job of the foreground kind, an extract with ``foreground_hint``);
- then **bulk** (the other submits);
- within each lane, connections take turns, one request per turn (round robin, the
  ZeroMQ guide's fair queueing), so a connection with 4,000 requests waiting and one
  with 1 are served alike; the turn order carries over from batch to batch;
- a batch holds at most ``max_control`` control and ``max_bulk`` bulk requests, and
  taking it costs O(batch size), whatever the backlog.

**Caps.** A connection may have at most ``per_conn`` requests pending; :meth:`push`
refuses one more (the front answers it ``queue_full`` with a retry hint). The total
over every connection is the front's to bound (it stops reading the socket).

**Order.** The protocol's guarantees hold because order is only ever changed between
requests of *different* (connection, job) keys: a control request whose job has a bulk
request pending on the same connection joins the bulk FIFO behind it, and is taken in
the same turn as the request it follows. So a cancel never overtakes the submit it
cancels, and a re-sent submit stays behind the first one. Requests without a job
(status, foreground, lifecycle) have no key and may go first freely.

Classification reads the raw decoded map only (cheap: the full validation runs once a
request is taken), so a malformed request is classified as control and answered early.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Pending", "classify", "Interactive", "FairInbox", "REPLY_ONLY"]

# Requests whose only effect is the reply: dropped, not served, once their client is gone.
REPLY_ONLY = frozenset({"status", "attach", "ping", "watch"})


@dataclass(frozen=True)
class Interactive:
    """What makes a submit interactive: the chat kind, the foreground kind (if any), and
    the kind that is T1 only with ``foreground_hint``."""

    chat_kind: str = "chat"
    foreground: str | None = None
    extract_kind: str = "extract"


@dataclass
class Pending:
    """One decoded, not yet validated request waiting in the front."""

    conn: bytes
    raw: Any  # the decoded message map (validated when taken)
    control: bool
    job_id: str | None  # the job the request is about, None for requests without a job
    owner: str | None = None  # the client's CURVE key, where it has one

    @property
    def reply_only(self) -> bool:
        # a hostile ``type`` may be a map or a list: unhashable, so no set lookup for it
        kind = self.raw.get("type") if isinstance(self.raw, Mapping) else None
        return isinstance(kind, str) and kind in REPLY_ONLY


def classify(conn: bytes, raw: Any, rules: Interactive, owner: str | None = None) -> Pending:
    """Sort one decoded message into control or bulk and note the job it is about."""
    if not isinstance(raw, Mapping):
        return Pending(conn, raw, True, None, owner)
    if raw.get("type") == "submit":
        job = raw.get("job")
        if not isinstance(job, Mapping):
            return Pending(conn, raw, True, None, owner)
        job_id = job.get("job_id")
        kind = job.get("kind")
        control = kind == rules.chat_kind or (
            kind is not None and kind == rules.foreground
            and (kind != rules.extract_kind or bool(job.get("foreground_hint"))))
        return Pending(conn, raw, control, job_id if isinstance(job_id, str) else None, owner)
    job_id = raw.get("job_id")
    return Pending(conn, raw, True, job_id if isinstance(job_id, str) else None, owner)


@dataclass
class _Conn:
    """One connection's pending requests."""

    control: deque[Pending] = field(default_factory=deque)
    bulk: deque[Pending] = field(default_factory=deque)
    bulk_jobs: Counter[str] = field(default_factory=Counter)  # job ids in ``bulk``

    def __len__(self) -> int:
        return len(self.control) + len(self.bulk)


class FairInbox:
    """See the module docstring. ``per_conn``: requests one connection may have pending."""

    def __init__(self, per_conn: int) -> None:
        if per_conn < 1:
            raise ValueError(f"per_conn must be >= 1, not {per_conn}")
        self.per_conn = per_conn
        self._conns: dict[bytes, _Conn] = {}
        self._control_turns: deque[bytes] = deque()  # connections with control pending
        self._bulk_turns: deque[bytes] = deque()  # connections with bulk pending
        self._count = 0
        self._controls = 0

    def __len__(self) -> int:
        return self._count

    @property
    def controls(self) -> int:
        """Control requests pending (a batch with control in it is never held back)."""
        return self._controls

    def pending_of(self, conn: bytes) -> int:
        entry = self._conns.get(conn)
        return len(entry) if entry is not None else 0

    def push(self, item: Pending) -> bool:
        """Queue ``item``; False (nothing queued) when its connection is at its cap."""
        entry = self._conns.get(item.conn)
        if entry is None:
            entry = self._conns[item.conn] = _Conn()
        elif len(entry) >= self.per_conn:
            return False
        if item.control and (item.job_id is None or item.job_id not in entry.bulk_jobs):
            if not entry.control:
                self._control_turns.append(item.conn)
            entry.control.append(item)
        else:
            if not entry.bulk:
                self._bulk_turns.append(item.conn)
            entry.bulk.append(item)
            if item.job_id is not None:
                entry.bulk_jobs[item.job_id] += 1
        self._count += 1
        self._controls += item.control
        return True

    def take_batch(self, max_control: int, max_bulk: int) -> list[Pending]:
        """The next batch, in the order to handle it (see the module docstring)."""
        batch: list[Pending] = []
        turns = self._control_turns
        while turns and len(batch) < max_control:
            conn = turns.popleft()
            entry = self._conns[conn]
            batch.append(entry.control.popleft())
            self._controls -= 1
            if entry.control:
                turns.append(conn)
            else:
                self._forget_if_empty(conn, entry)
        bulk_taken = 0
        turns = self._bulk_turns
        while turns and bulk_taken < max_bulk:
            conn = turns.popleft()
            entry = self._conns[conn]
            batch.append(self._take_bulk(entry))
            bulk_taken += 1
            # Control requests that followed it (same job) go with it, in order.
            while entry.bulk and entry.bulk[0].control:
                batch.append(self._take_bulk(entry))
            if entry.bulk:
                turns.append(conn)
            else:
                self._forget_if_empty(conn, entry)
        self._count -= len(batch)
        return batch

    def drop_reply_only(self, conn: bytes) -> int:
        """The client at ``conn`` is gone: forget its requests that would only be answered
        (status, attach); what changes state (submit, cancel, ...) stays. The count."""
        entry = self._conns.get(conn)
        if entry is None:
            return 0
        gone = [p for p in (*entry.control, *entry.bulk) if p.reply_only]
        if not gone:
            return 0
        kept_control = deque(p for p in entry.control if not p.reply_only)
        kept_bulk = deque(p for p in entry.bulk if not p.reply_only)
        dropped = len(gone)
        self._controls -= sum(p.control for p in gone)
        entry.control, entry.bulk = kept_control, kept_bulk
        entry.bulk_jobs = Counter(p.job_id for p in kept_bulk if p.job_id is not None)
        self._count -= dropped
        if not entry.control and conn in self._control_turns:
            self._control_turns.remove(conn)
        if not entry.bulk and conn in self._bulk_turns:
            self._bulk_turns.remove(conn)
        self._forget_if_empty(conn, entry)
        return dropped

    def _take_bulk(self, entry: _Conn) -> Pending:
        item = entry.bulk.popleft()
        if item.control:
            self._controls -= 1
        if item.job_id is not None:
            left = entry.bulk_jobs[item.job_id] - 1
            if left:
                entry.bulk_jobs[item.job_id] = left
            else:
                del entry.bulk_jobs[item.job_id]
        return item

    def _forget_if_empty(self, conn: bytes, entry: _Conn) -> None:
        if not entry.control and not entry.bulk:
            del self._conns[conn]
