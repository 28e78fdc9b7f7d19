"""The chaos client: raw protocol maps over one monitored DEALER, feeding a ledger.

Deliberately not :class:`~uniun.protocol.client.Client`: that one deduplicates tokens by
``seq`` and hides what the verdict must see (a token delivered twice, a second terminal
event). This one records everything and recovers the way the protocol says a client
may: when the scheduler goes away (monitor ``DISCONNECTED``) it opens a fresh socket,
and on the next handshake ``attach``es every open job with ``after_seq`` = the last
token it holds, then re-sends every request still unanswered (same ids; ``submit`` is
idempotent by ``job_id``). Single-threaded: the harness's loop calls :meth:`pump`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import zmq

from uniun.protocol import messages as m
from uniun.protocol.codec import encode, try_decode
from uniun.protocol.dealer import DealerConnection
from uniun.runtime.chaos.ledger import Ledger

__all__ = ["ChaosWire"]

Clock = Callable[[], float]


class ChaosWire(DealerConnection):
    """See the module docstring. ``on_token(job_id, now)`` hears every new token."""

    def __init__(self, endpoint: str, ledger: Ledger, clock: Clock) -> None:
        super().__init__(endpoint, linger_ms=0)
        self.ledger = ledger
        self.clock = clock
        self.handshakes = 0  # connections made (the first one and every reconnect)
        self.last_handshake_at = 0.0
        self.last_token_at = 0.0
        self.replies: dict[str, dict[str, Any]] = {}  # answers to status/ping, by id
        self._pending: dict[str, dict[str, Any]] = {}  # request id -> request
        self._lost = False
        self._open()

    # -- requests ---------------------------------------------------------------------

    def submit(self, job: dict[str, Any], template: str) -> None:
        self.ledger.submitted(job, template, self.clock())
        self._request(m.req_submit(self._next_id(), job))

    def attach(self, job_id: str, after_seq: int = -1) -> None:
        self._request(m.req_attach(self._next_id(), job_id, after_seq))

    def status(self) -> str:
        msg = m.req_status(self._next_id())
        self._request(msg)
        return msg["id"]

    def _request(self, msg: dict[str, Any]) -> None:
        self._pending[msg["id"]] = msg
        if self._connected:
            self._send(msg)  # otherwise the next handshake sends it

    def _send(self, msg: dict[str, Any]) -> None:
        assert self._sock is not None
        # No peer right now (IMMEDIATE): the handshake re-sends it.
        with contextlib.suppress(zmq.Again):
            self._sock.send(encode(msg, self._limits), zmq.NOBLOCK)

    # -- the loop ---------------------------------------------------------------------

    def pump(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for traffic and record what came."""
        if self._lost:
            self._lost = False
            self._close_socket()
            self._open()
        for parts in self._poll(timeout_s):
            if len(parts) == 1:
                self._route(parts[0])

    def _on_disconnect(self) -> None:
        self._lost = True  # a fresh socket at the next pump: a new scheduler knows none

    def _on_handshake(self) -> None:
        self.handshakes += 1
        self.last_handshake_at = self.clock()
        if self.handshakes == 1:
            for msg in list(self._pending.values()):
                self._send(msg)
            return
        # A (possibly new) scheduler: every open job attached first, then the unanswered
        # requests again. Attaches first, because an attach replays and subscribes in one
        # step: a job whose submit went unanswered is either known (replayed, then the
        # re-sent submit only acknowledges it) or not (``not_found``, then the submit
        # creates it). The other order subscribed on the submit and replayed on the
        # attach, so a token streamed between the two came twice (a CI run's duplicate).
        self._pending = {k: v for k, v in self._pending.items() if v["type"] != m.ATTACH}
        unanswered = list(self._pending.values())
        for hist in self.ledger.open_jobs():
            self.attach(hist.job_id, hist.last_seq)
        for msg in unanswered:
            self._send(msg)

    def _route(self, frame: bytes) -> None:
        msg = try_decode(frame, self._limits)
        if not isinstance(msg, dict):
            self.ledger.odd_replies.append({"undecodable": str(msg)})
            return
        now = self.clock()
        re = msg.get("re")
        if isinstance(re, str):
            request = self._pending.pop(re, None)
            if request is None:
                return  # the answer to a request sent twice (before and after a reconnect)
            if request["type"] in (m.SUBMIT, m.ATTACH):
                job_id = request["job"]["job_id"] if request["type"] == m.SUBMIT \
                    else request["job_id"]
                if msg.get("type") == "accepted":
                    self.ledger.accepted(job_id, now)
                elif request["type"] == m.SUBMIT:
                    self.ledger.rejected(job_id, msg)
                elif msg.get("code") != "not_found":
                    self.ledger.odd_replies.append(msg)
            else:
                self.replies[re] = msg
            return
        if msg.get("type") == "token":
            self.last_token_at = now
        self.ledger.event(msg)
