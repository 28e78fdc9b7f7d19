"""The runner-link actor: the scheduler's end of the runner socket.

Theory of operation. The link binds a ROUTER at ``runner_endpoint()`` (in a
:class:`~uniun.actors.socket_pump.SocketPump` thread) and works with exactly one runner
at a time: the one that said ``Hello`` last, addressed by its routing id. It

- forwards commands from the policy host (:class:`ToRunner`) to that runner;
- forwards that runner's reports to the host (:class:`FromRunner`) and drops reports of
  any other (an old incarnation's last words);
- answers every runner heartbeat with its own, whose ``ack`` names the runner it works
  with, so a runner it does not know (after a scheduler restart, or after being declared
  dead) says Hello again;
- declares the runner dead when it was silent past its :class:`Liveness`, when a send to
  it fails (ROUTER_MANDATORY; a beat goes to it every interval, so a killed runner is
  noticed within one), or when a new runner says Hello, and tells the host
  :class:`RunnerDown` before the new :class:`RunnerUp`.

It holds no job state: what was in flight is the host's business.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pykka
import zmq
from loguru import logger

from uniun.actors.socket_pump import Frames, Outbox, SocketPump
from uniun.protocol import runner_records as rp
from uniun.protocol.liveness import Liveness
from uniun.protocol.runner_socket import runner_socket

__all__ = ["RunnerLinkActor", "OpenLink", "ToRunner", "FromRunner", "RunnerUp",
           "RunnerDown", "RunnerStats"]


@dataclass(frozen=True)
class OpenLink:
    """Bind the runner socket (sent once the actors are wired)."""


@dataclass(frozen=True)
class ToRunner:
    """A command for the current runner (dropped, with a RunnerDown, if there is none)."""

    command: rp.Command


@dataclass(frozen=True)
class FromRunner:
    """A report of the current runner."""

    report: rp.Report


@dataclass(frozen=True)
class RunnerUp:
    """A runner said Hello: nothing runs on it; it holds records of ``hello.jobs``."""

    hello: rp.Hello


@dataclass(frozen=True)
class RunnerDown:
    """The runner we worked with is gone (or replaced); everything on it is lost."""

    reason: str


@dataclass(frozen=True)
class RunnerStats:
    """Parked-snapshot totals of the runner, sent when they change (``trimmed`` and
    ``spilled`` count the partial evictions and spills it did since it started)."""

    count: int
    nbytes: int
    trimmed: int = 0
    spilled: int = 0


@dataclass(frozen=True)
class _Inbound:
    frames: Frames


@dataclass(frozen=True)
class _Unroutable:
    identity: bytes


@dataclass(frozen=True)
class _Tick:
    now: float


class RunnerLinkActor(pykka.ThreadingActor):
    """See the module docstring."""

    def __init__(self, *, host: pykka.ActorRef, endpoint: str, liveness: Liveness,
                 ctx: zmq.Context) -> None:
        super().__init__()
        self._host = host
        self._endpoint = endpoint
        self._liveness = liveness
        self._ctx = ctx
        self._boot = rp.new_boot()
        self._pump: SocketPump | None = None
        self._outbox: Outbox | None = None
        self._peer: bytes | None = None  # routing id of the current runner
        self._peer_boot = ""
        self._peer_seq = 0  # last beat number read from the current runner
        self._last_seen = 0.0
        self._stats = (0, 0, 0, 0)

    # ---- lifecycle ------------------------------------------------------------------

    def _make_socket(self, ctx: zmq.Context) -> zmq.Socket:
        sock = runner_socket(ctx, zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.bind(self._endpoint)
        return sock

    def _open(self) -> None:
        self._pump = SocketPump(
            "runner-link", self._ctx, self._make_socket,
            lambda frames: self.actor_ref.tell(_Inbound(frames)),
            tick_s=self._liveness.interval_s,
            on_tick=self._on_tick,
            on_unroutable=lambda frames, why: self.actor_ref.tell(_Unroutable(frames[0])))
        self._pump.start()
        self._outbox = self._pump.outbox()
        logger.info("runner link bound at {}", self._endpoint)

    def _on_tick(self, now: float) -> list[Frames]:
        """Pump thread: wake the actor for its liveness check; sends nothing itself."""
        self.actor_ref.tell(_Tick(now))
        return []

    def on_stop(self) -> None:
        if self._outbox is not None:
            self._outbox.close()
        if self._pump is not None:
            self._pump.stop()

    # ---- messages -------------------------------------------------------------------

    def on_receive(self, message: Any) -> None:
        if isinstance(message, ToRunner):
            self._send_command(message.command)
        elif isinstance(message, _Inbound):
            self._on_inbound(message.frames)
        elif isinstance(message, _Tick):
            self._check_liveness(message.now)
        elif isinstance(message, _Unroutable):
            if message.identity == self._peer:
                self._lose("unreachable")
        elif isinstance(message, OpenLink):
            self._open()
        else:
            logger.warning("runner link: unexpected message {!r}", type(message).__name__)

    def _send_command(self, command: rp.Command) -> None:
        if self._peer is None or self._outbox is None:
            logger.debug("no runner for {}; dropped", command.kind)
            return
        self._outbox.send([self._peer, rp.encode(command)])

    def _on_inbound(self, frames: Frames) -> None:
        if len(frames) != 2:
            return
        identity = frames[0]
        try:
            record = rp.decode(frames[1])
        except rp.BadRecord as err:
            logger.warning("runner link: bad frame from {!r}: {}", identity, err)
            return
        if isinstance(record, rp.Heartbeat):
            self._on_heartbeat(identity, record)
        elif isinstance(record, rp.Hello):
            self._on_hello(identity, record)
        elif identity == self._peer:
            self._last_seen = Liveness.heard(time.monotonic(), previous=self._last_seen)
            self._host.tell(FromRunner(record))  # type: ignore[arg-type]
        else:
            logger.debug("report {} from a runner we do not work with; ignored", record.kind)

    def _on_heartbeat(self, identity: bytes, beat: rp.Heartbeat) -> None:
        if identity == self._peer:
            self._last_seen = Liveness.heard(time.monotonic(), beat.quiet_s,
                                             previous=self._last_seen)
            stats = (beat.snapshots, beat.snapshot_bytes, beat.trimmed, beat.spilled)
            if stats != self._stats:
                self._stats = stats
                self._host.tell(RunnerStats(*stats))
        ack = self._peer_boot if identity == self._peer else ""
        if identity == self._peer:
            self._peer_seq = beat.seq
        if self._outbox is not None:
            self._outbox.send([identity, rp.encode(rp.Heartbeat(boot=self._boot, ack=ack,
                                                                seq=beat.seq))])

    def _on_hello(self, identity: bytes, hello: rp.Hello) -> None:
        if self._peer is not None:
            self._lose("replaced by a new runner" if identity != self._peer else "said hello again")
        self._peer, self._peer_boot, self._peer_seq = identity, hello.boot, 0
        self._last_seen = time.monotonic()
        logger.info("runner up: pid {} boot {} model {} holding {} jobs", hello.pid, hello.boot,
                    hello.model_id, len(hello.jobs))
        self._host.tell(RunnerUp(hello))
        if self._outbox is not None:  # tell it at once that it is known now
            self._outbox.send([identity, rp.encode(rp.Heartbeat(boot=self._boot,
                                                                ack=hello.boot))])

    def _check_liveness(self, now: float) -> None:
        if self._peer is None:
            return
        if self._liveness.dead(self._last_seen, now):
            self._lose(f"silent for {now - self._last_seen:.1f} s")
        elif self._outbox is not None:
            # Unprompted beat: ROUTER_MANDATORY makes a send to a runner whose socket has
            # closed (killed) fail at once, so a dead runner is noticed within one interval.
            self._outbox.send([self._peer, rp.encode(rp.Heartbeat(
                boot=self._boot, ack=self._peer_boot, seq=self._peer_seq))])

    def _lose(self, reason: str) -> None:
        logger.warning("runner {} lost: {}", self._peer_boot, reason)
        self._peer, self._peer_boot = None, ""
        self._stats = (0, 0, 0, 0)
        self._host.tell(RunnerDown(reason))
