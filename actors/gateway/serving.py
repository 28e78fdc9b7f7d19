"""uvicorn as the gateway runs it: a header-read timeout, a connection cap, JSON refusals.

Why a protocol of our own (a subclass of uvicorn's h11 protocol, passed as ``http=``):
uvicorn has no header-read timeout. Its keep-alive timer runs only between a response
and the next request's first byte, so a client that opens a connection and sends a
header line now and then (slowloris) holds it for ever; ``h11_max_incomplete_event_size``
bounds the bytes such a client makes it buffer (16 KiB, uvicorn's default), not the
time. Here a timer runs from the connection's start, and again from each response,
until a request's headers are complete; when it fires the connection is closed (with a
408 if part of a request had arrived).

``limit_concurrency`` is uvicorn's cap, but over it uvicorn answers a plain-text 503,
and an overloaded server is not a client's mistake to be reported as one. So the cap is
checked here, with the same two counts uvicorn uses (open connections, requests in
flight), and a request over it gets 429 ``queue_full`` with ``Retry-After``, as the
gateway's other limits answer. A request h11 cannot parse gets an OpenAI error object
too, instead of uvicorn's plain-text 400.

A refusal sent while the client is still sending its body (413 for a body over the
limit, 415, 421 ...) ends with a *lingering close*, as nginx and Apache do: the server
shuts its side for writing and reads, and drops, what the client still sends, for up to
:data:`LINGER_S` or :data:`LINGER_BYTES`, before closing. Closing at once would make the
kernel answer the unread bytes with a reset, and a client busy sending (``http.client``,
a raw socket) would lose the refusal and see only "connection reset".

The protocol class is made per server (:func:`protocol_class`), with its settings as
class attributes, because uvicorn instantiates it itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from uniun.actors.gateway.door import error_bytes, send_error
from uniun.actors.gateway.errors import ApiError

__all__ = ["HEADER_TIMEOUT_S", "LINGER_BYTES", "LINGER_S", "MAX_CONNECTIONS", "protocol_class"]

HEADER_TIMEOUT_S = 10.0  # a request's headers must be complete within this, seconds
MAX_CONNECTIONS = 512  # connections (and requests in flight) served at once
LINGER_S = 2.0  # after a refusal mid-body: read and drop for at most this long, seconds
LINGER_BYTES = 4 << 20  # ... or at most this many bytes


class _Lingering:
    """The connection's transport, whose ``close`` lingers while the client is still
    sending a body (see the module docstring); everything else is the transport's."""

    def __init__(self, transport: asyncio.Transport, protocol: GatewayProtocol) -> None:
        self.raw = transport
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def is_closing(self) -> bool:
        return self._protocol.lingering or self.raw.is_closing()

    def close(self) -> None:
        protocol = self._protocol
        if not self.is_closing() and protocol.conn.their_state is h11.SEND_BODY \
                and self.raw.can_write_eof():
            protocol.start_lingering()
            return
        self.raw.close()


def _raw_answer(error: ApiError) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, for use below the ASGI app."""
    body = error_bytes(error)
    reason = {400: b"Bad Request", 408: b"Request Timeout"}.get(error.status, b"Error")
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (error.status, reason, len(body), body))


class GatewayProtocol(H11Protocol):
    """See the module docstring. Settings: :attr:`header_timeout_s`, :attr:`max_connections`."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._app = self.app
        self.app = self._capped
        self.lingering = False
        self._linger_left = LINGER_BYTES
        self._linger_timer: asyncio.TimerHandle | None = None

    # -- the cap ----------------------------------------------------------------------

    async def _capped(self, scope: Any, receive: Any, send: Any) -> None:
        # This request's own connection and task are counted already.
        if len(self.connections) > self.max_connections \
                or len(self.tasks) > self.max_connections:
            await send_error(send, ApiError(
                429, "the server has too many open connections; retry later",
                "rate_limit_error", code="queue_full"), close=True)
            return
        await self._app(scope, receive, send)

    # -- the header-read timeout ------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = _Lingering(transport, self)  # type: ignore[assignment]
        self._arm_header_timer()

    # -- the lingering close ----------------------------------------------------------

    def start_lingering(self) -> None:
        raw = self.transport.raw  # type: ignore[attr-defined]
        self.lingering = True
        self._cancel_header_timer()
        self._unset_keepalive_if_required()
        raw.write_eof()
        raw.resume_reading()
        self._linger_timer = self.loop.call_later(LINGER_S, raw.close)

    def data_received(self, data: bytes) -> None:
        if self.lingering:  # the rest of a refused body: dropped
            self._linger_left -= len(data)
            if self._linger_left <= 0:
                self.transport.raw.close()  # type: ignore[attr-defined]
            return
        super().data_received(data)

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        if self.conn.trailing_data[0]:  # part of a request arrived, never all its headers
            self.transport.write(_raw_answer(ApiError(
                408, f"the request headers did not arrive within {self.header_timeout_s:g} s",
                code="request_timeout")))
        self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a request's headers are complete
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        # Armed first: a pipelined request already buffered is handled inside the call
        # below, and its complete headers cancel the timer again.
        if not self.transport.is_closing():
            self._arm_header_timer()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)

    # -- malformed requests -----------------------------------------------------------

    def send_400_response(self, msg: str) -> None:
        self._cancel_header_timer()
        self.transport.write(_raw_answer(ApiError(
            400, "malformed HTTP request (request line, headers or framing)",
            code="bad_envelope")))
        self.transport.close()


def protocol_class(header_timeout_s: float = HEADER_TIMEOUT_S,
                   max_connections: int = MAX_CONNECTIONS) -> type[GatewayProtocol]:
    """:class:`GatewayProtocol` with these settings, for ``uvicorn.Config(http=...)``."""
    return type("GatewayProtocol", (GatewayProtocol,),
                {"header_timeout_s": header_timeout_s, "max_connections": max_connections})
