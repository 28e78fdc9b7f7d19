"""The door of the runtime's HTTP listeners: who may talk to them, and how much they read.

Why a door at all, on a server that listens on loopback only: every web page the user
opens can make the browser send requests to ``127.0.0.1``. Three holes follow, and a
rule closes each before any handler runs:

- **DNS rebinding** (the hole Ollama closed in CVE-2024-28224): a page on
  ``evil.example`` re-points its own name at 127.0.0.1; the browser then treats the
  gateway as same-origin with the page and reads every answer. The request still says
  ``Host: evil.example``, so a ``Host`` that is not a loopback name, the configured bind
  address or a configured name is refused (421) before anything else.
- **Cross-site requests without a preflight**: a form or ``fetch`` with
  ``Content-Type: text/plain`` (or no type) is sent without asking CORS first, so the
  page cannot read the answer but the job still runs. A request whose ``Origin`` is not
  the gateway's own (or whose ``Sec-Fetch-Site`` says another site sent it) is refused
  (403), and a body must be ``application/json`` (415), which no page can send to
  another origin without a preflight that this server never approves. Clients that are
  not browsers (curl, the SDKs) send no ``Origin`` and are not affected.
- **A body larger than the server will take**: a declared ``Content-Length`` over the
  limit is refused (413) before one byte of the body is read, a chunked body is cut off
  (413) the moment it passes the limit, and a body that does not arrive within the read
  timeout is answered 408, so one client cannot make the server hold a large or a slow
  body.

Why one module of pure rules and a thin adapter: the rules are functions of the method
and the headers, with no I/O and no clock, so they are unit-tested exhaustively without
a server; the same rules guard the gateway (:class:`Door` and :class:`BodyLimit`, ASGI
middleware) and the supervisor's metrics listener (``runtime/metrics_http.py``,
``http.server``). This module imports nothing from Starlette or uvicorn, so the
supervisor can use it.
Refusals are :class:`~uniun.actors.gateway.errors.ApiError` values: OpenAI's error
object, the same shape as every other refusal of the gateway.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from uniun.actors.gateway.errors import ApiError

__all__ = [
    "LOOPBACK_NAMES",
    "BodyLimit",
    "Door",
    "DoorPolicy",
    "check_request",
    "content_type_refusal",
    "error_bytes",
    "host_refusal",
    "length_refusal",
    "origin_refusal",
]

Headers = Sequence[tuple[bytes, bytes]]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # a body must be JSON on these
CROSS_SITE = frozenset({"cross-site", "same-site"})  # Sec-Fetch-Site values refused
ANY_HOST = "*"


@dataclass(frozen=True)
class DoorPolicy:
    """What the door lets in. ``hosts``: lower-case names (no port) a ``Host`` header may
    carry besides the loopback names; ``any_host``: the ``Host`` rule is off (``*`` in
    ``[http] allowed_hosts``, which the config accepts only with an API key)."""

    hosts: frozenset[str] = frozenset()
    any_host: bool = False
    max_body_bytes: int = 1 << 20  # a request body, bytes
    read_timeout_s: float = 10.0  # a request body must arrive within this, seconds

    @classmethod
    def make(cls, bind_host: str, allowed_hosts: Iterable[str] = (), *,
             max_body_bytes: int = 1 << 20, read_timeout_s: float = 10.0) -> DoorPolicy:
        """The policy of a listener bound to ``bind_host`` (its own address is a name it
        may be called by, unless it is a wildcard) with the configured extra names."""
        names = {_bracketed(h.strip().lower()) for h in allowed_hosts if h.strip()}
        any_host = ANY_HOST in names
        names.discard(ANY_HOST)
        own = _bracketed(bind_host.strip().lower())
        if own and own not in ("0.0.0.0", "[::]"):
            names.add(own)
        return cls(frozenset(names | LOOPBACK_NAMES), any_host, max_body_bytes, read_timeout_s)


def _bracketed(host: str) -> str:
    """An IPv6 address as a ``Host`` header writes it: ``::1`` -> ``[::1]``."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def _values(headers: Headers, name: bytes) -> list[bytes]:
    return [value for key, value in headers if key.lower() == name]


def split_host(value: str) -> tuple[str, str] | None:
    """``Host`` header -> (lower-case name, port text or ""); None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1:]
        try:
            ipaddress.IPv6Address(name[1:-1])
        except ValueError:
            return None
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return None
        return name, rest[1:]
    name, _, port = value.partition(":")
    if not name or (port and not port.isdigit()) or (":" in port):
        return None
    if any(not (c.isalnum() or c in "-._") for c in name):
        return None
    return name, port


def host_refusal(headers: Headers, policy: DoorPolicy) -> ApiError | None:
    """421 unless there is exactly one ``Host`` naming this server (any port)."""
    values = _values(headers, b"host")
    if len(values) != 1:
        return ApiError(400, "exactly one Host header is required", code="invalid_host")
    if policy.any_host:
        return None
    parsed = split_host(values[0].decode("latin-1"))
    if parsed is not None and parsed[0] in policy.hosts:
        return None
    return ApiError(421, "this server does not answer to that Host name; call it by a "
                         "loopback address (127.0.0.1, localhost, [::1]) or a name in its "
                         "[http] allowed_hosts", code="invalid_host")


def origin_refusal(headers: Headers) -> ApiError | None:
    """403 for a request a page of another origin made the browser send.

    No ``Origin``: a client that is not a browser, or a browser's same-origin GET or
    navigation; refused only if ``Sec-Fetch-Site`` says another site sent it. With an
    ``Origin``: it must be this server as the request's ``Host`` names it (``http`` or
    ``https``, behind a TLS proxy), which is what the gateway's own pages send.
    """
    origins = _values(headers, b"origin")
    if not origins:
        sites = _values(headers, b"sec-fetch-site")
        if any(s.strip().lower().decode("latin-1") in CROSS_SITE for s in sites):
            return _foreign()
        return None
    hosts = _values(headers, b"host")
    if len(origins) != 1 or len(hosts) != 1:
        return _foreign()
    origin = origins[0].strip().lower().decode("latin-1")
    host = hosts[0].strip().lower().decode("latin-1")
    if origin in (f"http://{host}", f"https://{host}"):
        return None
    return _foreign()


def _foreign() -> ApiError:
    return ApiError(403, "requests from another origin (a web page of another site) are "
                         "refused", code="invalid_origin")


def content_type_refusal(method: str, headers: Headers) -> ApiError | None:
    """415 unless a POST/PUT/PATCH says ``application/json`` (charset utf-8 if any)."""
    if method.upper() not in BODY_METHODS:
        return None
    values = _values(headers, b"content-type")
    if len(values) == 1:
        media, *params = values[0].decode("latin-1").split(";")
        charset_ok = all(
            p.strip().lower().replace('"', "") in ("charset=utf-8", "")
            for p in params if p.strip().lower().startswith("charset"))
        if media.strip().lower() == "application/json" and charset_ok:
            return None
    return ApiError(415, "the body must be JSON (Content-Type: application/json)",
                    code="unsupported_media_type")


def length_refusal(headers: Headers, max_body_bytes: int) -> ApiError | None:
    """413 for a declared ``Content-Length`` over the limit (nothing of it read yet)."""
    for value in _values(headers, b"content-length"):
        text = value.strip()
        if text.isdigit() and int(text) > max_body_bytes:
            return too_large(max_body_bytes)
    return None


def too_large(max_body_bytes: int) -> ApiError:
    return ApiError(413, f"the request body is over {max_body_bytes} bytes",
                    code="bad_envelope")


def check_request(method: str, headers: Headers, policy: DoorPolicy) -> ApiError | None:
    """Every rule, in order: Host, Origin, Content-Type, Content-Length."""
    return (host_refusal(headers, policy) or origin_refusal(headers)
            or content_type_refusal(method, headers)
            or length_refusal(headers, policy.max_body_bytes))


def error_bytes(error: ApiError) -> bytes:
    """The error object as the bytes of a JSON body (ASCII: safe whatever it echoes)."""
    return json.dumps(error.body(), ensure_ascii=True).encode()


# ---- the ASGI adapter -----------------------------------------------------------------

Scope = MutableMapping[str, Any]


class Door:
    """ASGI middleware: the rules above, on the headers alone. The body is read further
    in, by :class:`BodyLimit`, once the API key (if any) has been checked, so a client
    without the key never has a body read."""

    def __init__(self, app: Any, policy: DoorPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refusal = check_request(scope["method"], scope["headers"], self.policy)
            if refusal is not None:
                await send_error(send, refusal, close=True)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """ASGI middleware: the whole body of a POST/PUT/PATCH read here, within the limit and
    the timeout, then handed to the application as one message.

    Reading it here (instead of leaving it to the handler) is what lets the limit hold
    while reading: a handler's ``await request.body()`` would have buffered it all.
    """

    def __init__(self, app: Any, policy: DoorPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        body = await self._read_body(receive, send)
        if body is None:
            return
        await self.app(scope, _Replay(body, receive), send)

    async def _read_body(self, receive: Any, send: Any) -> bytes | None:
        """The whole body, or None once refused (413, 408) or the client has gone."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.policy.read_timeout_s
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0))
            except asyncio.TimeoutError:
                await send_error(send, ApiError(
                    408, f"the request body did not arrive within "
                         f"{self.policy.read_timeout_s:g} s", code="request_timeout"),
                    close=True)
                return None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.policy.max_body_bytes:
                await send_error(send, too_large(self.policy.max_body_bytes), close=True)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


class _Replay:
    """``receive`` for the application: the body read by the door, then the real one
    (so a handler still hears ``http.disconnect``)."""

    def __init__(self, body: bytes, receive: Any) -> None:
        self._body: bytes | None = body
        self._receive = receive

    async def __call__(self) -> dict[str, Any]:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        return await self._receive()


async def send_error(send: Any, error: ApiError, *, close: bool = False) -> None:
    """An OpenAI error answer on a raw ASGI ``send``."""
    body = error_bytes(error)
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers().items()]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
