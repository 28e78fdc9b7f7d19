"""The front actor: owns the scheduler's client-facing ROUTER socket.

Theory of operation. A :class:`~uniun.actors.socket_pump.SocketPump` thread owns the
ROUTER (created in that thread; ROUTER_MANDATORY on, bounded LINGER, a hard MAXMSGSIZE)
and tells this actor every incoming message. The actor decodes it under the codec's
limits, validates it (``protocol.messages.parse_request``), answers what it can answer
alone (``ping``, every malformed message, and everything while the scheduler is
stopping) and tells the policy host the rest as a :class:`ClientRequest`. Replies and
job events come back as :class:`Outgoing` tells; the actor encodes them and pushes them
to the pump through its own outbox socket.

Batches (issue 9, point 4). The pump thread only appends raw frames to a queue; the
actor drains it whole, decodes every frame (cheap), and keeps the decoded requests
pending. It hands the host one :class:`ClientBatch` at a time, and the next only after
the host said :class:`BatchDone`, so what waits, waits here, where the next batch is
picked by ``inbox_order.take_batch``: control (chat and foreground submits, cancels,
status, ...) before at most ``BATCH_BULK`` bulk submits, never reordering two requests
of the same (connection, job). Full validation runs when a request is taken.

Reading first. The actors share one interpreter lock, so every millisecond the host
spends on a burst's submits is one the pump and the front do not spend reading what came
behind them, a chat included. So a batch of bulk only is held back while frames are
known to be waiting: queued by the pump and not yet drained (a kick is on its way), or
still in the socket (the pump's ``backlog``; its ``on_caught_up`` tells the front
:class:`_Retry`). A batch with control in it is never held, and holding lasts
``HOLD_S`` at most per burst: under a steady flood the pump may never catch up, and bulk
must still move.

Malformed input is answered when the sender can be addressed and never raises out of a
handler (an exception in a ``tell`` handler would stop the actor, and with it the
process). Frames between the protocol limit and the socket's hard cap get a
``bad_envelope`` answer; beyond the hard cap ZeroMQ drops the connection itself, which is
the only way to refuse a frame that big without reading it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka
import zmq
from loguru import logger

from uniun.actors.scheduler.inbox_order import Interactive, Pending, classify, take_batch
from uniun.actors.socket_pump import Frames, Outbox, SocketPump
from uniun.models.convert.recipes import can_run_jobs
from uniun.models.store import ModelStore
from uniun.protocol import messages as m
from uniun.protocol import requests as rq
from uniun.protocol.codec import EncodeError, Limits, decode, encode
from uniun.protocol.endpoints import remove_endpoint, write_endpoint
from uniun.protocol.errors import ErrorCode, ProtocolError

__all__ = ["FrontActor", "ClientRequest", "ClientBatch", "BatchDone", "ClientGone",
           "Outgoing", "OpenFront", "Stopping", "ModelIds"]

SNDHWM = 50_000  # messages queued per client before further ones are dropped (not blocked)
BATCH_BULK = 128  # bulk submits per batch: the longest a chat waits behind bulk in the host
HOLD_S = 0.1  # longest bulk-only batches wait, per burst, for frames still arriving


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
class ClientBatch:
    """Requests for the host, in the order to handle them (see the module docstring)."""

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
class _Kick:
    """Raw frames are waiting in the front's queue."""


@dataclass(frozen=True)
class _Retry:
    """The pump caught up with the socket: look again at a held-back bulk batch."""


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
                 interactive: Interactive | None = None,
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
        self._interactive = interactive or Interactive()
        self._raw: deque[Frames] = deque()  # appended by the pump thread
        self._kick_lock = threading.Lock()
        self._kicked = False
        self._pending: list[Pending] = []
        self._controls = 0  # control requests in _pending
        self._in_host = False  # a batch is with the host
        self._held_at: float | None = None  # bulk held back since (monotonic s)
        self._hold_spent = False  # HOLD_S used up; no more holding until the pump catches up

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
                                self._arrived, on_unroutable=self._unroutable,
                                on_caught_up=lambda: self.actor_ref.tell(_Retry()))
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

    def _arrived(self, frames: Frames) -> None:
        """Pump thread: queue the frames; wake the actor once per drain, not per frame."""
        self._raw.append(frames)
        with self._kick_lock:
            if self._kicked:
                return
            self._kicked = True
        self.actor_ref.tell(_Kick())

    def _unroutable(self, frames: Frames, why: str) -> None:
        """Pump thread: a message to a client could not be sent."""
        logger.debug("message to a client dropped ({})", why)
        if why == "peer gone":
            self._host.tell(ClientGone(frames[0]))

    # ---- messages -------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Kick):
            self._drain_raw()
            self._flush()
        elif isinstance(message, BatchDone):
            self._in_host = False
            self._flush()
        elif isinstance(message, _Retry):
            self._hold_spent = False
            self._flush()
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

    def _drain_raw(self) -> None:
        """Decode every queued frame into ``_pending`` (malformed ones answered now)."""
        with self._kick_lock:
            self._kicked = False  # frames appended from now on kick again
        raw_queue = self._raw
        while raw_queue:
            frames = raw_queue.popleft()
            conn = frames[0]
            if len(frames) != 2:
                self._send(conn, m.reply_error(None, ProtocolError(
                    ErrorCode.BAD_ENVELOPE, "one message must be exactly one frame")))
                continue
            try:
                raw = decode(frames[1], self._limits)
            except ProtocolError as err:
                self._send(conn, m.reply_error(None, err))
                continue
            if isinstance(raw, dict) and raw.get("type") == "ping":
                self._validate(conn, raw)  # answered here and now, whatever the host does
                continue
            pending = classify(conn, raw, self._interactive)
            self._controls += pending.control
            self._pending.append(pending)

    def _flush(self) -> None:
        """Give the host the next batch, unless it still has one or should wait."""
        while self._pending and not self._in_host and not self._hold_bulk():
            batch, self._pending = take_batch(self._pending, BATCH_BULK)
            self._controls = sum(p.control for p in self._pending)
            requests = [r for r in (self._validate(p.conn, p.raw) for p in batch) if r]
            if requests:
                self._host.tell(ClientBatch(requests))
                self._in_host = True

    def _hold_bulk(self) -> bool:
        """Whether to hold the next batch back: bulk only, while frames are known to be
        waiting ("Reading first" in the module docstring). Whatever ends the wait (a
        kick, the pump's caught-up retry, a finished batch) flushes again."""
        waiting = bool(self._raw) or (self._pump is not None and self._pump.backlog)
        if not waiting:
            self._hold_spent = False
        if self._controls or not waiting or self._hold_spent:
            self._held_at = None
            return False
        now = time.monotonic()
        if self._held_at is None:
            self._held_at = now
        elif now - self._held_at >= HOLD_S:
            self._held_at, self._hold_spent = None, True
            return False
        return True

    def _validate(self, conn: bytes, raw: Any) -> ClientRequest | None:
        """The request for the host, or None when it was answered here."""
        re_id = rq.reply_to(raw)
        try:
            request = rq.parse_request(raw, self._rules)
        except ProtocolError as err:
            self._send(conn, m.reply_error(re_id, err))
            return None
        except Exception as err:  # a validation bug must not take the front down
            logger.exception("front: validating a request failed")
            self._send(conn, m.reply_error(re_id, ProtocolError(ErrorCode.INTERNAL, str(err))))
            return None
        if isinstance(request, rq.Ping):
            self._send(conn, m.reply_pong(request.id))
        elif self._stopping and not isinstance(request, rq.StatusRequest):
            self._send(conn, m.reply_error(request.id, ProtocolError(
                ErrorCode.SHUTTING_DOWN, "the scheduler is stopping; retry after it restarts")))
        else:
            if isinstance(request, rq.Foreground):  # foreground submits are control now
                self._interactive = Interactive(self._interactive.chat_kind, request.kind,
                                                self._interactive.extract_kind)
            return ClientRequest(conn, request)
        return None

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
