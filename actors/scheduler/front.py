"""The front actor: owns the scheduler's client-facing ROUTER socket.

Theory of operation. A :class:`~uniun.actors.socket_pump.SocketPump` thread owns the
ROUTER (created in that thread; ROUTER_MANDATORY on, bounded LINGER, a hard MAXMSGSIZE)
and tells this actor every incoming message. The actor decodes it under the codec's
limits, validates it (``protocol.messages.parse_request``), answers what it can answer
alone (``ping``, every malformed message, and everything while the scheduler is
stopping) and tells the policy host the rest as a :class:`ClientRequest`. Replies and
job events come back as :class:`Outgoing` tells; the actor encodes them and pushes them
to the pump through its own outbox socket.

Batches. The pump thread only appends raw frames to a queue; the actor drains it
whole, decodes every frame (cheap), and keeps the decoded requests in a
:class:`~uniun.actors.scheduler.inbox_order.FairInbox`. It hands the host one
:class:`ClientBatch` at a time, and the next only after the host said
:class:`BatchDone`, so what waits, waits here, where the next batch is picked fairly:
control (chat and foreground submits, cancels, status, ...) before bulk submits,
connections taking turns within each, never reordering two requests of the same
(connection, job). Full validation runs when a request is taken.

Bounds. A connection may have ``conn_pending_cap`` requests pending; one more is
answered ``queue_full`` with a ``retry_after_s`` hint at once and costs no memory. All
connections together may have ``pending_cap`` frames read and not yet handed on: at that
bound the pump stops reading the socket (``SocketPump``'s ``max_held``), so ZeroMQ's
high-water marks push back on the senders, and the ROUTER's fair queueing serves every
connection in turn once reading resumes. A client that is gone (a send to it found no
route) has its pending status and attach requests dropped, not served, and nothing more
is encoded for it until it sends again.

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

Crash marker. A submit whose validation runs native code is validated inside the
:class:`~uniun.actors.scheduler.crash_marker.CrashMarker` (when the scheduler gives the
front one), so a request that was being validated at two of the scheduler's deaths is
answered ``poisoned`` instead of being validated, and killing it, a third time.
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

from uniun.actors.scheduler.crash_marker import CrashMarker
from uniun.actors.scheduler.front_messages import (
    BatchDone,
    ClientBatch,
    ClientGone,
    ClientRequest,
    FrontDepth,
    OpenFront,
    Outgoing,
    Stopping,
)
from uniun.actors.scheduler.inbox_order import FairInbox, Interactive, classify
from uniun.actors.scheduler.peers import MutedPeers
from uniun.actors.socket_pump import Frames, Outbox, SocketPump
from uniun.protocol import messages as m, requests as rq
from uniun.protocol.codec import EncodeError, Limits, decode, encode
from uniun.protocol.endpoints import remove_endpoint, write_endpoint
from uniun.protocol.errors import ErrorCode, ProtocolError

__all__ = ["CONN_PENDING_CAP", "PENDING_CAP", "FrontActor"]

BATCH_CONTROL = 64  # control requests per batch (connections take turns)
BATCH_BULK = 128  # bulk submits per batch: the longest a chat waits behind bulk in the host
HOLD_S = 0.1  # longest bulk-only batches wait, per burst, for frames still arriving
# Frames decoded per turn of the actor: under a flood, replies and BatchDone (already in
# the mailbox) get their turn between two such bursts instead of after the flood.
DRAIN_BURST = 256
CONN_PENDING_CAP = 16_384  # requests one connection may have pending; more: queue_full
PENDING_CAP = 65_536  # requests pending, all connections; then reading stops
# Frames read and not yet decoded. Decoding is where fairness starts (per connection), so
# this queue is short: a chat's frame waits behind at most this many of a flood's.
RAW_CAP = 512
# Replies queued per client before further ones are dropped (never blocked): room for a
# burst as large as the default per-connection cap, read late; a client that lets more
# pile up does not read, and is muted (peers.py). Each reply it cost is memory here.
SNDHWM = 16_384
RETRY_AFTER_S = 0.5  # the hint sent with a per-connection queue_full, s


@dataclass(frozen=True)
class _Kick:
    """Raw frames are waiting in the front's queue."""


@dataclass(frozen=True)
class _Unroutable:
    """A send to a client failed: no route (``gone``), or its reply queue is full."""

    conn: bytes
    gone: bool


@dataclass(frozen=True)
class _Retry:
    """The pump caught up with the socket: look again at a held-back bulk batch."""


class FrontActor(pykka.ThreadingActor):
    """See the module docstring."""

    def __init__(self, *, endpoint: str, host: pykka.ActorRef, rules: rq.JobRules,
                 limits: Limits, linger_ms: int, ctx: zmq.Context,
                 interactive: Interactive | None = None,
                 socket_setup: Callable[[zmq.Socket], None] | None = None,
                 conn_pending_cap: int = CONN_PENDING_CAP,
                 pending_cap: int = PENDING_CAP, raw_cap: int = RAW_CAP,
                 sndhwm: int = SNDHWM, crash_marker: CrashMarker | None = None) -> None:
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
        self._raw: deque[tuple[Frames, str | None]] = deque()  # appended by the pump thread
        self._kick_lock = threading.Lock()
        self._kicked = False
        self._inbox = FairInbox(conn_pending_cap)
        self._pending_cap = pending_cap
        self._raw_cap = raw_cap
        self._sndhwm = sndhwm
        self._crash_marker = crash_marker  # closed here, in on_stop, after the last use
        self._in_vain = 0  # frames read from clients their replies could not reach
        self._muted = MutedPeers(time.monotonic)  # clients replies cannot reach
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
        sock.setsockopt(zmq.SNDHWM, self._sndhwm)
        if self._socket_setup is not None:
            self._socket_setup(sock)
        sock.bind(self._endpoint)
        return sock

    def _open(self) -> None:
        self._pump = SocketPump("front", self._ctx, self._make_socket,
                                self._arrived, on_unroutable=self._unroutable,
                                on_caught_up=lambda: self.actor_ref.tell(_Retry()),
                                max_held=self._raw_cap,
                                user_id=self._socket_setup is not None)
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
        if self._crash_marker is not None:
            self._crash_marker.close()

    def _arrived(self, frames: Frames, user_id: str | None = None) -> None:
        """Pump thread: queue the frames; wake the actor once per drain, not per frame."""
        self._raw.append((frames, user_id))
        self._kick()

    def _unroutable(self, frames: Frames, why: str) -> None:
        """Pump thread: a message to a client could not be sent."""
        if why in ("peer gone", "peer queue full"):
            self.actor_ref.tell(_Unroutable(frames[0], why == "peer gone"))

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
        elif isinstance(message, _Unroutable):
            self._unreachable(message.conn, message.gone)
        elif isinstance(message, OpenFront):
            self._open()
            return self.bound
        elif isinstance(message, Stopping):
            self._stopping = True
        elif isinstance(message, FrontDepth):
            return {"read": len(self._raw), "pending": len(self._inbox),
                    "muted": len(self._muted), "in_vain": self._in_vain}
        else:
            logger.warning("front: unexpected message {!r}", type(message).__name__)
        return None

    def _drain_raw(self) -> None:
        """Decode up to ``DRAIN_BURST`` queued frames into the inbox (malformed ones
        answered now). More waiting: kick again, behind what came meanwhile; the inbox
        at ``pending_cap``: leave them (the pump stops reading) until a batch is taken."""
        with self._kick_lock:
            self._kicked = False  # frames appended from now on kick again
        raw_queue = self._raw
        for _ in range(DRAIN_BURST):
            if not raw_queue or len(self._inbox) >= self._pending_cap:
                return
            frames, owner = raw_queue.popleft()
            in_vain = self._take_frame(frames, owner)
            self._in_vain += in_vain
            if self._pump is not None:
                (self._pump.release_slowly if in_vain else self._pump.release)()
        self._kick()

    def _kick(self) -> None:
        """Drain again soon, if frames wait (once per drain, not per frame)."""
        if not self._raw:
            return
        with self._kick_lock:
            if self._kicked:
                return
            self._kicked = True
        self.actor_ref.tell(_Kick())

    def _take_frame(self, frames: Frames, owner: str | None) -> bool:
        """Queue one frame's request in the inbox, or answer it here. True: it was read
        in vain, its answer could not reach its client (the pump then reads that much
        slower; socket_pump.py)."""
        conn = frames[0]
        self._muted.heard_from(conn)
        if len(frames) != 2:
            self._send(conn, m.reply_error(None, ProtocolError(
                ErrorCode.BAD_ENVELOPE, "one message must be exactly one frame")))
            return False
        try:
            raw = decode(frames[1], self._limits)
        except ProtocolError as err:
            self._send(conn, m.reply_error(None, err))
            return False
        if isinstance(raw, dict) and raw.get("type") == "ping":
            self._validate(conn, raw, owner)  # answered here and now, whatever the host does
            return False
        pending = classify(conn, raw, self._interactive, owner)
        if pending.reply_only and self._muted.muted(conn):
            return True  # its answer could not reach it (see peers.py)
        if self._inbox.push(pending):
            return False
        if self._muted.muted(conn):
            return True
        self._send(conn, m.reply_error(rq.reply_to(raw), ProtocolError(
            ErrorCode.QUEUE_FULL, f"this connection has {self._inbox.per_conn} requests "
            f"waiting in the scheduler, its cap; retry after {RETRY_AFTER_S} s",
            retry_after_s=RETRY_AFTER_S)))
        return False

    def _flush(self) -> None:
        """Give the host the next batch, unless it still has one or should wait."""
        while len(self._inbox) and not self._in_host and not self._hold_bulk():
            batch = self._inbox.take_batch(BATCH_CONTROL, BATCH_BULK)
            self._kick()  # frames left behind by a full inbox may come in now
            requests = [r for r in (self._validate(p.conn, p.raw, p.owner) for p in batch) if r]
            if requests:
                self._host.tell(ClientBatch(requests))
                self._in_host = True

    def _unreachable(self, conn: bytes, gone: bool) -> None:
        """Replies cannot reach ``conn``: drop what it would only be answered, and tell
        the host when it is gone (its jobs stop streaming to it)."""
        if gone:
            if not self._muted.gone(conn):
                return
            self._host.tell(ClientGone(conn))
        else:
            self._muted.congested(conn)
        dropped = self._inbox.drop_reply_only(conn)
        self._kick()
        logger.debug("a client {}; {} of its requests dropped unanswered",
                     "went away" if gone else "does not read", dropped)

    def _hold_bulk(self) -> bool:
        """Whether to hold the next batch back: bulk only, while frames are known to be
        waiting ("Reading first" in the module docstring). Whatever ends the wait (a
        kick, the pump's caught-up retry, a finished batch) flushes again."""
        waiting = bool(self._raw) or (self._pump is not None and self._pump.backlog)
        if not waiting:
            self._hold_spent = False
        if self._inbox.controls or not waiting or self._hold_spent:
            self._held_at = None
            return False
        now = time.monotonic()
        if self._held_at is None:
            self._held_at = now
        elif now - self._held_at >= HOLD_S:
            self._held_at, self._hold_spent = None, True
            return False
        return True

    def _validate(self, conn: bytes, raw: Any, owner: str | None) -> ClientRequest | None:
        """The request for the host, or None when it was answered here."""
        re_id = rq.reply_to(raw)
        try:
            request = self._parse(raw)
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
            return ClientRequest(conn, request, owner)
        return None

    def _parse(self, raw: Any) -> rq.Request:
        """``parse_request``, inside the crash marker when there is one: it raises
        ``poisoned`` for a request that killed the scheduler twice while validated here,
        and remembers which request this is until validation returns (crash_marker.py)."""
        if self._crash_marker is None:
            return rq.parse_request(raw, self._rules)
        with self._crash_marker.validating(raw):
            return rq.parse_request(raw, self._rules)

    def _send(self, conn: bytes, msg: dict[str, Any]) -> None:
        if self._outbox is None or self._muted.muted(conn):
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
