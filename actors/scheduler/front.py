"""The front actor: owns the scheduler's client-facing ROUTER socket.

Theory of operation. A :class:`~uniun.actors.socket_pump.SocketPump` thread owns the
ROUTER (created in that thread; ROUTER_MANDATORY on, bounded LINGER, a hard MAXMSGSIZE)
and tells this actor every incoming message. The actor decodes it under the codec's
limits, validates it (``protocol.messages.parse_request``), answers what it can answer
alone (``ping``, every malformed message, and everything while the scheduler is
stopping) and tells the policy host the rest as a :class:`ClientRequest`. Replies and
job events come back as :class:`Outgoing` tells; the actor encodes them and pushes them
to the pump through its own outbox socket.

Malformed input is answered when the sender can be addressed and never raises out of a
handler (an exception in a ``tell`` handler would stop the actor, and with it the
process). Frames between the protocol limit and the socket's hard cap get a
``bad_envelope`` answer; beyond the hard cap ZeroMQ drops the connection itself, which is
the only way to refuse a frame that big without reading it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka
import zmq
from loguru import logger

from uniun.actors.socket_pump import Frames, Outbox, SocketPump
from uniun.models.convert.recipes import can_run_jobs
from uniun.models.store import ModelStore
from uniun.protocol import messages as m
from uniun.protocol import requests as rq
from uniun.protocol.codec import EncodeError, Limits, decode, encode
from uniun.protocol.endpoints import remove_endpoint, write_endpoint
from uniun.protocol.errors import ErrorCode, ProtocolError

__all__ = ["FrontActor", "ClientRequest", "ClientGone", "Outgoing", "OpenFront", "Stopping", "ModelIds"]

SNDHWM = 50_000  # messages queued per client before further ones are dropped (not blocked)


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
class _Inbound:
    frames: Frames


class ModelIds:
    """``model_id in ModelIds(store)``: a decoder a job can run on (see ``can_run_jobs``)."""

    def __init__(self, store: ModelStore) -> None:
        self._store = store
        self._known: set[str] = set()

    def __contains__(self, model_id: object) -> bool:
        if not isinstance(model_id, str):
            return False
        if model_id in self._known:
            return True
        ok = can_run_jobs(model_id, self._store)
        if ok:
            self._known.add(model_id)
        return ok


class FrontActor(pykka.ThreadingActor):
    """See the module docstring."""

    def __init__(self, *, endpoint: str, host: pykka.ActorRef, rules: rq.JobRules,
                 limits: Limits, linger_ms: int, ctx: zmq.Context,
                 socket_setup: Callable[[zmq.Socket], None] | None = None) -> None:
        super().__init__()
        self._socket_setup = socket_setup  # e.g. CURVE for a tcp front (runtime/security.py)
        self._endpoint = endpoint
        self._host = host
        self._rules = rules
        self._limits = limits
        self._linger_ms = linger_ms
        self._ctx = ctx
        self._pump: SocketPump | None = None
        self._outbox: Outbox | None = None
        self._stopping = False
        self.bound = ""

    # ---- lifecycle ------------------------------------------------------------------

    def _make_socket(self, ctx: zmq.Context) -> zmq.Socket:
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, self._linger_ms)
        # Hard cap: frames up to 4x the protocol limit are read and answered
        # bad_envelope; bigger ones make ZeroMQ drop the peer without reading them.
        sock.setsockopt(zmq.MAXMSGSIZE, self._limits.frame_bytes * 4 + 4096)
        sock.setsockopt(zmq.SNDHWM, SNDHWM)
        if self._socket_setup is not None:
            self._socket_setup(sock)
        sock.bind(self._endpoint)
        return sock

    def _open(self) -> None:
        self._pump = SocketPump("front", self._ctx, self._make_socket,
                                lambda frames: self.actor_ref.tell(_Inbound(frames)),
                                on_unroutable=self._unroutable)
        self._pump.start()
        self._outbox = self._pump.outbox()
        self.bound = self._pump.last_endpoint or self._endpoint
        write_endpoint(self.bound)
        logger.info("front bound at {}", self.bound)

    def on_stop(self) -> None:
        if self._outbox is not None:
            self._outbox.close()
        if self._pump is not None:
            self._pump.stop()
            remove_endpoint(only_if=self.bound)

    def _unroutable(self, frames: Frames, why: str) -> None:
        """Pump thread: a message to a client could not be sent."""
        logger.debug("message to a client dropped ({})", why)
        if why == "peer gone":
            self._host.tell(ClientGone(frames[0]))

    # ---- messages -------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Inbound):
            self._on_inbound(message.frames)
        elif isinstance(message, Outgoing):
            self._send(message.conn, message.msg)
        elif isinstance(message, OpenFront):
            self._open()
            return self.bound
        elif isinstance(message, Stopping):
            self._stopping = True
        else:
            logger.warning("front: unexpected message {!r}", type(message).__name__)
        return None

    def _on_inbound(self, frames: Frames) -> None:
        conn = frames[0]
        if len(frames) != 2:
            self._send(conn, m.reply_error(None, ProtocolError(
                ErrorCode.BAD_ENVELOPE, "one message must be exactly one frame")))
            return
        try:
            raw = decode(frames[1], self._limits)
        except ProtocolError as err:
            self._send(conn, m.reply_error(None, err))
            return
        re_id = rq.reply_to(raw)
        try:
            request = rq.parse_request(raw, self._rules)
        except ProtocolError as err:
            self._send(conn, m.reply_error(re_id, err))
            return
        except Exception as err:  # a validation bug must not take the front down
            logger.exception("front: validating a request failed")
            self._send(conn, m.reply_error(re_id, ProtocolError(ErrorCode.INTERNAL, str(err))))
            return
        if isinstance(request, rq.Ping):
            self._send(conn, m.reply_pong(request.id))
        elif self._stopping and not isinstance(request, rq.StatusRequest):
            self._send(conn, m.reply_error(request.id, ProtocolError(
                ErrorCode.SHUTTING_DOWN, "the scheduler is stopping; retry after it restarts")))
        else:
            self._host.tell(ClientRequest(conn, request))

    def _send(self, conn: bytes, msg: dict[str, Any]) -> None:
        if self._outbox is None:
            return
        try:
            frame = encode(msg, self._limits)
        except EncodeError as err:  # our bug; tell the client something instead of nothing
            logger.error("front: cannot encode {} message: {}", msg.get("type"), err)
            if msg.get("type") == m.ERROR:  # an error echoing too much: the same, shortened
                frame = encode(_shortened_error(msg), self._limits)
            else:
                frame = encode(m.reply_error(msg.get("re"), ProtocolError(
                    ErrorCode.INTERNAL, "reply could not be encoded")), self._limits)
        self._outbox.send([conn, frame])


def _shortened_error(msg: dict[str, Any]) -> dict[str, Any]:
    """An error message whose text fields are cut short: it keeps its code, ``re`` and
    ``job_id``, so a client still learns why (a reply is owed even for a huge key)."""
    out = dict(msg)
    for key in ("message", "field"):
        if isinstance(out.get(key), str) and len(out[key]) > 200:
            out[key] = out[key][:200] + "..."
    return out
