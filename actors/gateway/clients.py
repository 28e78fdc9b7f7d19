"""Who an HTTP client is, and how many requests it may hold open at the gateway.

**Identity.** The gateway serves loopback by default, where every program of the machine
comes from ``127.0.0.1``: the remote address alone cannot tell the user's console from a
script beside it. So a client is its remote address plus, when the request carries one,
the console session cookie (:data:`COOKIE`) that ``GET /`` gives a browser that has none
(HttpOnly, SameSite=Strict, so neither the page's scripts nor another site's pages can
read or send it). Every tab of one browser shares one cookie and is one client; a
program that sends no cookie is its address. The API key names no one: there is one key,
shared by every client that has it. None of this holds off a hostile local program (it
can fetch as many cookies as it likes, and on loopback without a key it may do anything
the user can); it keeps a busy or buggy client from crowding out the others.

**Fair shares.** The scheduler shares the runner between the clients that chat
(docs/scheduling.md, T0), but every HTTP client reaches it through the gateway's pool of
connections, so the gateway names the client in each job's ``client`` field
(:func:`job_client`): the address and a digest of the cookie, never the cookie itself
(the scheduler's log, journal and status are read by others). A client's many
connections, requests and ``n`` choices are one client there.

**Open requests** (:class:`OpenRequests`): jobs and embedding requests open through the
gateway, each holding a worker thread, are bounded in all (``[http] max_open_requests``)
and per client (``max_open_requests_per_client``), so one client cannot take every
slot. And requests that are not chats (a job of another kind, which the ``uniun``
extension asks for, or an embedding request) may hold only the slots beyond
``chat_reserve``, so however much background work a client queues, a chat finds a slot.

Counts are read and written on the event loop only: no lock.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from loguru import logger
from starlette.requests import HTTPConnection
from starlette.responses import Response

from uniun.actors.gateway.errors import ApiError

__all__ = ["COOKIE", "Caps", "OpenRequests", "Ticket", "client_of", "give_cookie",
           "job_client", "shown"]

COOKIE = "uniun_client"  # the console session cookie: a random name for one browser
COOKIE_SHAPE = re.compile(r"[A-Za-z0-9_-]{16,64}")  # what the gateway issues (and accepts)
NO_ADDRESS = "local"  # a connection without a remote address (a Unix socket)


def client_of(conn: HTTPConnection) -> str:
    """The client's identity: ``ADDRESS`` or ``ADDRESS COOKIE`` (see the module docstring)."""
    address = conn.client.host if conn.client is not None else NO_ADDRESS
    cookie = conn.cookies.get(COOKIE, "")
    return f"{address} {cookie}" if COOKIE_SHAPE.fullmatch(cookie) else address


def job_client(client: str) -> str:
    """The name the scheduler gets for ``client`` (a job's ``client`` field): the address,
    and the cookie as a digest that tells browsers apart without revealing the cookie."""
    address, _, cookie = client.partition(" ")
    if not cookie:
        return f"http {address}"
    return f"http {address} {hashlib.sha256(cookie.encode()).hexdigest()[:16]}"


def shown(client: str) -> str:
    """The identity as a message or a log line may show it: the cookie's value stays out."""
    address, _, cookie = client.partition(" ")
    return f"{address} with its console cookie" if cookie else address


def give_cookie(conn: HTTPConnection, response: Response) -> Response:
    """``response`` with a fresh console cookie, unless the request carries a valid one
    (a browser keeps its identity across reloads and tabs)."""
    if not COOKIE_SHAPE.fullmatch(conn.cookies.get(COOKIE, "")):
        response.set_cookie(COOKIE, secrets.token_urlsafe(18), path="/", httponly=True,
                             samesite="strict")
    return response


@dataclass(frozen=True)
class Caps:
    """The bounds on open requests (``[http]``; docs/http.md)."""

    total: int = 256  # max_open_requests
    per_client: int = 64  # max_open_requests_per_client
    chat_reserve: int = 32  # chat_reserve: slots only chats may take

    @property
    def not_chat(self) -> int:
        """Slots requests that are not chats may hold together (at least one)."""
        return max(self.total - self.chat_reserve, 1)


class OpenRequests:
    """The open-request counts of the gateway: in all, per client, not chats."""

    def __init__(self, caps: Caps) -> None:
        self.caps = caps
        self.total = 0
        self.not_chat = 0
        self.by_client: dict[str, int] = {}

    def ticket(self, client: str, *, chat: bool) -> Ticket:
        """An empty ticket for one HTTP request; it takes a slot per job it runs."""
        return Ticket(self, client, chat)

    def refusal(self, client: str, *, chat: bool) -> ApiError | None:
        """The 429 one more slot for ``client`` would get, or None."""
        caps, held = self.caps, self.by_client.get(client, 0)
        if held >= caps.per_client:
            return _busy(f"this client ({shown(client)}) has {held} requests open at the "
                         f"gateway (the cap per client is {caps.per_client}, [http] "
                         "max_open_requests_per_client); retry when one has ended")
        if self.total >= caps.total:
            return _busy(f"{self.total} requests are open at the gateway (the cap is "
                         f"{caps.total}, [http] max_open_requests); retry later")
        if not chat and self.not_chat >= caps.not_chat:
            return _busy(f"{self.not_chat} requests that are not chats are open at the "
                         f"gateway; they may hold {caps.not_chat} of its {caps.total} slots "
                         f"(the other {caps.total - caps.not_chat} are kept for chats, "
                         "[http] chat_reserve); retry later")
        return None

    def _take(self, client: str, chat: bool) -> None:
        refused = self.refusal(client, chat=chat)
        if refused is not None:
            logger.debug("gateway: a request of {} refused: {}", shown(client), refused.message)
            raise refused
        self.total += 1
        self.not_chat += 0 if chat else 1
        self.by_client[client] = self.by_client.get(client, 0) + 1

    def _give_back(self, client: str, chat: bool, count: int) -> None:
        self.total -= count
        self.not_chat -= 0 if chat else count
        left = self.by_client.get(client, 0) - count
        if left > 0:
            self.by_client[client] = left
        else:
            self.by_client.pop(client, None)


class Ticket:
    """The slots one HTTP request holds: one per job it runs (``n`` of them), or one for
    an embedding request. Given back as each job ends; never more than taken."""

    def __init__(self, book: OpenRequests, client: str, chat: bool) -> None:
        self.book = book
        self.client = client
        self.chat = chat
        self.held = 0

    def take(self) -> None:
        """One more slot, or :class:`ApiError` 429 saying which bound was met."""
        self.book._take(self.client, self.chat)
        self.held += 1

    def give_back(self, count: int = 1) -> None:
        count = min(count, self.held)
        if count > 0:
            self.held -= count
            self.book._give_back(self.client, self.chat, count)


def _busy(message: str) -> ApiError:
    return ApiError(429, message, "rate_limit_error", code="queue_full")
