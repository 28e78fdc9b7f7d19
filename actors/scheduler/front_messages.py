"""What the front and the policy host tell each other, and what the process tells the
front (plain frozen records; the front's theory of operation is in ``front.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from uniun.protocol import requests as rq

__all__ = ["BatchDone", "ClientBatch", "ClientGone", "ClientRequest", "FrontDepth",
           "OpenFront", "Outgoing", "Stopping"]


@dataclass(frozen=True)
class OpenFront:
    """Bind the socket (sent once the actors are wired, so no request beats the wiring)."""


@dataclass(frozen=True)
class Stopping:
    """From now on, answer every request but ping and status with ``shutting_down``."""


@dataclass(frozen=True)
class ClientRequest:
    """A valid request for the policy host; ``conn`` is the client's routing id."""

    conn: bytes
    request: rq.Request
    owner: str | None = None  # the CURVE key of the client (None on ipc and plain tcp)


@dataclass(frozen=True)
class ClientBatch:
    """Requests for the host, in the order to handle them (see ``front.py``)."""

    requests: list[ClientRequest]


@dataclass(frozen=True)
class BatchDone:
    """From the host: the last batch is handled; send the next."""


@dataclass(frozen=True)
class ClientGone:
    """A client's connection is gone (a send to it found no route): stop sending to it."""

    conn: bytes


@dataclass(frozen=True)
class Outgoing:
    """A message for one client (a reply or a job event), as a protocol map."""

    conn: bytes
    msg: dict[str, Any]


@dataclass(frozen=True)
class FrontDepth:
    """``ask``: how much waits in the front (``read``: frames read and not decoded;
    ``pending``: requests queued; ``muted``: clients replies cannot reach; ``in_vain``:
    frames read so far that were dropped because their client was muted)."""
