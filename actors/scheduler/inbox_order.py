"""Which of the front's pending requests go to the host next, and in what order (pure).

Why (issue 9, point 4): a burst of thousands of small background submits must not make
a chat, a cancel or a status wait behind it. The front drains its socket in batches;
this module picks the next batch out of everything pending:

- **control** first: every request but a submit, and the submits of interactive work (a
  chat, a job of the foreground kind, an extract with ``foreground_hint``);
- then at most ``max_bulk`` **bulk** requests (the other submits), oldest first;
- the rest stays pending, in its order.

The protocol's guarantees hold because order is only ever changed between requests of
*different* (connection, job) keys: a request is never taken ahead of an earlier
pending request with the same key, and a control request whose key matches a bulk
request taken in the same batch is placed after it. So a cancel never overtakes the
submit it cancels, and a re-sent submit stays behind the first one. Requests without a
job (status, foreground, lifecycle) have no key and may go first freely.

Classification reads the raw decoded map only (cheap: the full validation runs once a
request is taken), so a malformed request is classified as control and answered early.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Pending", "classify", "take_batch", "Interactive"]


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
    key: tuple[bytes, str] | None  # (connection, job_id), None for requests without a job


def classify(conn: bytes, raw: Any, rules: Interactive) -> Pending:
    """Sort one decoded message into control or bulk and give it its order key."""
    if not isinstance(raw, Mapping):
        return Pending(conn, raw, True, None)
    kind_of_msg = raw.get("type")
    if kind_of_msg == "submit":
        job = raw.get("job")
        if not isinstance(job, Mapping):
            return Pending(conn, raw, True, None)
        job_id = job.get("job_id")
        key = (conn, job_id) if isinstance(job_id, str) else None
        kind = job.get("kind")
        control = kind == rules.chat_kind or (
            kind is not None and kind == rules.foreground
            and (kind != rules.extract_kind or bool(job.get("foreground_hint"))))
        return Pending(conn, raw, control, key)
    job_id = raw.get("job_id")
    return Pending(conn, raw, True, (conn, job_id) if isinstance(job_id, str) else None)


def take_batch(pending: Iterable[Pending], max_bulk: int
               ) -> tuple[list[Pending], list[Pending]]:
    """``(batch, rest)``: the next batch in the order to handle it, and what stays."""
    control: list[Pending] = []
    bulk: list[Pending] = []
    rest: list[Pending] = []
    left: set[tuple[bytes, str]] = set()  # keys of requests that stay pending
    taken_bulk: set[tuple[bytes, str]] = set()  # keys of bulk requests in this batch
    for item in pending:
        key = item.key
        if key is not None and key in left:
            rest.append(item)
        elif item.control and (key is None or key not in taken_bulk):
            control.append(item)
        elif item.control:
            bulk.append(item)  # after the bulk request of the same job it follows
        elif len(bulk) < max_bulk:
            bulk.append(item)
            if key is not None:
                taken_bulk.add(key)
        else:
            rest.append(item)
            if key is not None:
                left.add(key)
    return control + bulk, rest
