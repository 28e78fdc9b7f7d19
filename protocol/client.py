"""The client library: what producers, the CLI and tests use to talk to the scheduler.

Theory of operation:

- One ``Client`` owns one DEALER socket connected to the front (ipc or tcp). All I/O
  happens in the calling thread, inside the blocking calls: a ``Client`` is **not**
  thread-safe (use one per thread). It never spins: every wait is a ``zmq.Poller``
  poll with a timeout.
- Everything that arrives is routed: replies by ``re`` to the request waiting for them,
  job events by ``job_id`` to that job's :class:`JobStream` queue. So several jobs can
  stream at once through one client; iterating one stream buffers the others' events.
- Liveness: a socket monitor reports the ZMTP handshake (the scheduler is there) and
  disconnects (it went away, e.g. it was killed). While waiting, if nothing has
  arrived for ``heartbeat_s``, the client sends a ``ping``; no ``pong`` within
  ``timeout`` also counts as lost (a hung scheduler).
- Reconnect-and-attach: on a lost scheduler the client opens a *new* DEALER (the
  scheduler knows connections by identity; a restarted one knows none), waits up to
  ``reconnect_timeout`` for a scheduler, re-sends every request still waiting for its
  reply (same ids; ``submit`` is idempotent by ``job_id``) and re-``attach``es every
  open stream with ``after_seq`` = the last token it holds. Tokens are deduplicated by
  ``seq``, so none is delivered twice.
- A submit is re-sent after one lost scheduler, not after a second: a submit that was in
  flight, unanswered, through :data:`POISON_AFTER_LOSSES` (2) losses may be what kills
  the scheduler (a crash while validating it), and sending it to every new scheduler
  would stop the runtime at the supervisor's restart limit. It ends in a
  :class:`ClientError` ``poisoned`` (not retryable). A submit that was answered and
  streams is re-attached however often the scheduler goes.
- Errors: an ``error`` reply raises :class:`ClientError` (``code``, ``field``,
  ``retryable``); no scheduler raises :class:`SchedulerUnavailable`, and so does a
  CURVE server that refused this client's key (at once, not at the timeout); a connected
  scheduler that does not answer in time raises :class:`Timeout`. A message we cannot
  encode raises ``EncodeError`` before anything is sent.

:class:`JobStream` and the exceptions live in :mod:`uniun.protocol.jobstream` and are
re-exported here: ``from uniun.protocol.client import Client, ClientError`` is the API.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import zmq
from loguru import logger

from uniun.protocol import messages as m
from uniun.protocol.codec import DEFAULT_LIMITS, Limits, encode, try_decode
from uniun.protocol.curve import ClientCurve
from uniun.protocol.dealer import DealerConnection
from uniun.protocol.endpoints import front_endpoint
from uniun.protocol.errors import ErrorCode, ProtocolError
from uniun.protocol.jobstream import (
    ClientError,
    JobFailed,
    JobStream,
    SchedulerUnavailable,
    Timeout,
)

__all__ = ["Client", "ClientError", "JobFailed", "JobStream", "SchedulerUnavailable",
           "Timeout"]

_ENVELOPE_KEYS = ("v", "type", "re")
STATES_KEPT = 1024  # state pushes kept unread; the oldest are dropped beyond
POISON_AFTER_LOSSES = 2  # scheduler losses an unanswered submit lives through: not re-sent


@dataclass
class _Pending:
    msg: dict[str, Any]
    reply: dict[str, Any] | None = None
    on_reply: Callable[[dict[str, Any]], None] | None = None  # asynchronous requests
    in_flight: bool = False  # handed to a connected socket since the last loss
    losses: int = 0  # scheduler losses it was in flight at, unanswered


class Client(DealerConnection):
    """A connection to the scheduler's front. See the module docstring.

    ``endpoint``: default :func:`~uniun.protocol.endpoints.front_endpoint` (the
    ``front.endpoint`` file, else ``ipc://$UNIUN_HOME/run/front.sock``).
    ``timeout``: seconds to wait for a reply (and for a first connection), default 10.
    ``reconnect_timeout``: seconds to wait for a lost scheduler to come back, default 30.
    ``heartbeat_s``: silence after which a waiting client pings, default 2.
    ``linger_s``: how long unsent messages may hold up context termination, default 0.5.
    """

    def __init__(self, endpoint: str | None = None, timeout: float = 10.0, *,
                 reconnect: bool = True, reconnect_timeout: float = 30.0,
                 heartbeat_s: float = 2.0, linger_s: float = 0.5,
                 limits: Limits = DEFAULT_LIMITS, context: zmq.Context | None = None,
                 curve: ClientCurve | None = None) -> None:
        super().__init__(front_endpoint(endpoint), linger_ms=int(linger_s * 1000),
                         limits=limits, context=context, curve=curve)
        self.timeout = timeout
        self.reconnect = reconnect
        self.reconnect_timeout = reconnect_timeout
        self.heartbeat_s = heartbeat_s
        self.reconnects = 0  # how many times a lost scheduler was reconnected
        self._pending: dict[str, _Pending] = {}
        self._streams: dict[str, JobStream] = {}
        self._lost = False
        self._last_rx = time.monotonic()  # last traffic of any kind (handshake included)
        self._last_msg = time.monotonic()  # last message from the scheduler
        self._recovered_at: float | None = None  # end of the last reconnect
        self._silent_since = 0.0  # start of the current run of unanswered reconnects
        self._ping: tuple[str, float] | None = None  # liveness ping in flight: (id, sent)
        self._watching = False  # ``watch`` sent: ``state`` pushes are queued in _states
        self._states: deque[dict[str, Any]] = deque(maxlen=STATES_KEPT)
        self._open()

    # -- public API ---------------------------------------------------------------

    def submit(self, job: Mapping[str, Any], *, timeout: float | None = None) -> JobStream:
        """Submit a job map (``job_id`` generated if absent); return its event stream.

        Raises ``ClientError`` if the scheduler refuses it (nothing is then queued).
        """
        job = dict(job)
        job.setdefault("job_id", uuid.uuid4().hex)
        msg = m.req_submit(self._next_id(), job)
        stream = self._streams.get(job["job_id"]) or JobStream(self, job["job_id"])
        self._streams[stream.job_id] = stream
        try:
            stream.accepted = self._request(msg, timeout)
        except BaseException:
            self._streams.pop(stream.job_id, None)
            raise
        return stream

    def attach(self, job_id: str, *, after_seq: int = -1,
               timeout: float | None = None) -> JobStream:
        """Subscribe to the events of a job submitted earlier (e.g. by a previous run).

        ``after_seq``: tokens up to this ``seq`` are already held and will be skipped.
        """
        stream = self._streams.get(job_id) or JobStream(self, job_id)
        stream.last_seq = max(stream.last_seq, after_seq)
        self._streams[job_id] = stream
        try:
            stream.accepted = self._request(
                m.req_attach(self._next_id(), job_id, stream.last_seq), timeout)
        except BaseException:
            self._streams.pop(job_id, None)
            raise
        return stream

    def cancel(self, job_id: str, *, timeout: float | None = None) -> dict[str, Any]:
        """Cancel a job; return the ``cancelled`` reply. Its stream here then ends."""
        reply = self._request(m.req_cancel(self._next_id(), job_id), timeout)
        stream = self._streams.pop(job_id, None)
        if stream is not None:
            stream._ended = True
        return reply

    def foreground(self, kind: str | None, *, timeout: float | None = None) -> None:
        """Tell the scheduler which job kind the user is looking at (None: none)."""
        self._request(m.req_foreground(self._next_id(), kind), timeout)

    def lifecycle(self, state: str | None, *, power: dict[str, Any] | None = None,
                  timeout: float | None = None) -> None:
        """``"foreground"`` or ``"background"``: whether the app is in front; ``power``:
        the device's facts as the app's OS reports them (``on_battery``, ``percent``,
        ``thermal``, ``user_idle``; docs/device.md). ``state=None`` sends power only."""
        self._request(m.req_lifecycle(self._next_id(), state, power), timeout)

    def status(self, *, timeout: float | None = None) -> dict[str, Any]:
        """The scheduler's ``status`` body (policy, queues, running, processes, ...)."""
        reply = self._request(m.req_status(self._next_id()), timeout)
        return {k: v for k, v in reply.items() if k not in _ENVELOPE_KEYS}

    def watch(self, *, timeout: float | None = None) -> None:
        """Follow the scheduler's state: from now on :meth:`next_state` returns its
        ``state`` pushes (the timeline as it is written, and the status when it
        changes; docs/protocol.md). Kept across reconnects."""
        self._watching = True  # the first push may arrive with the reply
        try:
            self._request(m.req_watch(self._next_id()), timeout)
        except BaseException:
            self._watching = False
            self._states.clear()
            raise

    def next_state(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next ``state`` push (its fields: ``status`` and/or ``segments`` and
        ``marks``), or None when none came within ``timeout`` seconds."""
        if not self._watching:
            raise RuntimeError("call watch() first")
        try:
            self._wait_until(lambda: bool(self._states), timeout, "a state push")
        except Timeout:
            return None
        state = self._states.popleft()
        return {k: v for k, v in state.items() if k not in ("v", "type")}

    def ping(self, *, timeout: float | None = None) -> float:
        """Round-trip time of a ``ping``, seconds."""
        start = time.monotonic()
        self._request(m.req_ping(self._next_id()), timeout)
        return time.monotonic() - start

    def close(self) -> None:
        """Close the socket. Open streams end; running jobs are not cancelled."""
        for stream in list(self._streams.values()):
            stream._ended = True
        self._streams.clear()
        self._pending.clear()
        self._close_socket()

    # -- socket ---------------------------------------------------------------------

    def _open(self) -> None:
        super()._open()
        self._lost = False

    def _send(self, msg: dict[str, Any]) -> bool:
        """Queue ``msg`` for the scheduler; False when there was no peer to take it."""
        if self._sock is None:
            raise RuntimeError("client is closed")
        frame = encode(msg, self._limits)
        try:
            self._sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            self._lost = True  # no peer: the request stays pending and is re-sent
            return False
        return True

    def _request(self, msg: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        timeout = self.timeout if timeout is None else timeout
        encode(msg, self._limits)  # fail on a bad message before any state changes
        self._wait_until(lambda: self._connected, timeout, "connecting")
        pending = _Pending(msg)
        self._pending[msg["id"]] = pending
        try:
            pending.in_flight = self._send(msg)
            self._wait_until(lambda: pending.reply is not None, timeout, f"{msg['type']} reply")
        finally:
            self._pending.pop(msg["id"], None)
        assert pending.reply is not None
        if pending.reply["type"] == m.ERROR:
            raise ClientError.from_msg(pending.reply)
        return pending.reply

    # -- waiting and routing ------------------------------------------------------

    def _release(self, job_id: str) -> None:
        """A stream has ended: stop routing its job's events to it."""
        self._streams.pop(job_id, None)

    def _wait_until(self, done: Callable[[], bool], timeout: float | None, what: str) -> None:
        """Pump the socket until ``done()``; reconnect on loss; raise on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            if self._sock is None:
                raise RuntimeError("client is closed")
            if self._lost:
                self._recover()
                continue
            now = time.monotonic()
            if not self._connected and self.refused:
                # The server answered "not you": waiting out the timeout tells nothing more.
                raise SchedulerUnavailable(f"{self.endpoint}: {self.refused}")
            if deadline is not None and now >= deadline:
                if not self._connected:
                    raise SchedulerUnavailable(
                        f"no scheduler at {self.endpoint} within {timeout:g}s "
                        "(is `uniun-runtime start` running?)")
                raise Timeout(f"{what}: no answer from the scheduler within {timeout:g}s")
            self._check_liveness(now)
            wait = self.heartbeat_s if deadline is None else min(deadline - now, self.heartbeat_s)
            self._pump(wait)

    def _check_liveness(self, now: float) -> None:
        if not self._connected:
            return
        if self._ping is not None:
            if now - self._ping[1] > self.timeout:
                logger.warning("scheduler at {} silent for {:.1f}s; reconnecting",
                               self.endpoint, now - self._last_rx)
                self._lost = True
        elif now - self._last_rx > self.heartbeat_s:
            ping_id = self._next_id()
            self._ping = (ping_id, now)
            self._pending[ping_id] = _Pending(m.req_ping(ping_id), on_reply=self._on_pong)
            self._send(self._pending[ping_id].msg)

    def _on_pong(self, reply: dict[str, Any]) -> None:
        self._ping = None

    def _pump(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for traffic and route all that arrived."""
        for parts in self._poll(timeout_s):
            self._last_rx = self._last_msg = time.monotonic()
            if len(parts) != 1:
                logger.warning("dropped a {}-part message; protocol v1 is one frame", len(parts))
                continue
            self._route(parts[0])

    def _on_handshake(self) -> None:
        self._last_rx = time.monotonic()

    def _on_disconnect(self) -> None:
        logger.info("lost the scheduler at {}", self.endpoint)
        self._lost = True

    def _route(self, frame: bytes) -> None:
        msg = try_decode(frame, self._limits)
        if isinstance(msg, ProtocolError):
            logger.warning("dropped an undecodable message from the scheduler: {}", msg.message)
            return
        try:
            kind = m.classify(msg)
        except ProtocolError as err:
            logger.warning("dropped a message from the scheduler: {}", err.message)
            return
        if kind == "state":
            if self._watching:
                self._states.append(msg)
            return
        if kind == "reply":
            pending = self._pending.get(msg["re"])
            if pending is None:
                logger.debug("late or duplicate reply to {}", msg["re"])
            elif pending.on_reply is not None:
                del self._pending[msg["re"]]
                pending.on_reply(msg)
            else:
                pending.reply = msg
            return
        stream = self._streams.get(msg["job_id"])
        if stream is not None:
            stream._push(msg)

    def _recover(self) -> None:
        """New socket, wait for a scheduler, re-send pending requests, re-attach streams."""
        if not self.reconnect:
            self._lost = False
            self._close_socket()
            self._open()
            raise SchedulerUnavailable(f"lost the scheduler at {self.endpoint}")
        now = time.monotonic()
        if self._recovered_at is None or self._last_msg > self._recovered_at:
            self._silent_since = now  # a new loss, not a repeat of the last one
        elif now - self._silent_since > self.reconnect_timeout:
            # Reconnecting keeps reaching a scheduler that never answers: it is hung.
            self._lost = True
            raise SchedulerUnavailable(
                f"the scheduler at {self.endpoint} has not answered for "
                f"{now - self._silent_since:.0f}s of reconnecting")
        self._close_socket()
        self._open()
        self._lost = True  # until re-sent and re-attached (e.g. if Ctrl-C lands in here)
        self.reconnects += 1
        # Asynchronous requests (liveness pings, earlier re-attaches) are regenerated below.
        for mid in [mid for mid, p in self._pending.items() if p.on_reply is not None]:
            del self._pending[mid]
        self._ping = None
        deadline = time.monotonic() + self.reconnect_timeout
        while not self._connected:
            remaining = deadline - time.monotonic()
            if remaining <= 0:  # still lost: the next call tries again
                raise SchedulerUnavailable(
                    f"the scheduler at {self.endpoint} went away and did not come back "
                    f"within {self.reconnect_timeout:g}s")
            self._pump(min(remaining, 0.5))
        self._recovered_at = time.monotonic()
        self._lost = False
        logger.info("reconnected to {}; re-attaching {} job(s)", self.endpoint,
                    len(self._streams))
        for pending in list(self._pending.values()):
            self._resend(pending)
        if self._watching:  # a restarted scheduler knows no watchers
            watch = m.req_watch(self._next_id())
            self._pending[watch["id"]] = _Pending(watch, on_reply=lambda _reply: None)
            self._send(watch)
        # A re-sent submit or attach already re-subscribes this connection to its job.
        resubscribed = {p.msg["job"]["job_id"] if p.msg["type"] == m.SUBMIT else p.msg["job_id"]
                        for p in self._pending.values() if p.msg["type"] in (m.SUBMIT, m.ATTACH)}
        for stream in list(self._streams.values()):
            if stream.job_id in resubscribed:
                continue
            attach = m.req_attach(self._next_id(), stream.job_id, stream.last_seq)
            self._pending[attach["id"]] = _Pending(attach, on_reply=stream._on_attach_reply)
            self._send(attach)

    def _resend(self, pending: _Pending) -> None:
        """Send an unanswered request again (same id: submit is idempotent by job_id),
        unless it is a submit that was in flight at ``POISON_AFTER_LOSSES`` losses of the
        scheduler: that one is answered ``poisoned`` here (module docstring)."""
        if pending.reply is not None:  # answered: nothing to send, nothing to count
            return
        if pending.in_flight and pending.msg["type"] == m.SUBMIT:
            pending.losses += 1
        if pending.losses < POISON_AFTER_LOSSES:
            pending.in_flight = self._send(pending.msg)
            return
        job_id = pending.msg["job"]["job_id"]
        logger.bind(job=job_id).warning(
            "submit unanswered through {} scheduler restarts; not sent again", pending.losses)
        pending.reply = m.reply_error(pending.msg["id"], ProtocolError(
            ErrorCode.POISONED, f"this request was in flight through {pending.losses} "
            "scheduler restarts without an answer; it may be what crashes the scheduler, "
            "so it is not sent again", job_id=job_id))
