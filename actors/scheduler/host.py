"""The scheduler host actor: feeds the scheduler core and carries out what it returns.

Thin by design (docs/style.md §2, "Actors are thin"): every message is turned into one call of
:class:`~uniun.actors.scheduler.core.SchedulerCore`, followed by ``core.pump()``; the
:class:`~uniun.actors.scheduler.effects.Effects` that come back are applied in their fixed
order — journal writes committed first, then client messages told to the front, then
runner commands told to the link — and the core's ``wake_at`` arms the one timer. Nothing
here decides anything, blocks, or asks another actor.

Two lanes, so control is never queued behind bulk work. Client requests come from the front a
:class:`~uniun.actors.scheduler.front.ClientBatch` at a time (control first); their
journal writes are committed in one transaction per chunk of ``CHUNK`` requests, and
the host answers :class:`BatchDone` when it is through. The runner link does not tell
the host directly: it tells a :class:`RunnerLane`, a FIFO the host drains before every
input and between chunks of a batch, so a runner report (a chat's first token, a
``paused`` that frees the runner for a chat) never waits behind a backlog of submits.

After every input the host hands the policy's pure ``interactive()`` answer to the
device-state publisher (``device_signal.py``), if there is one.

A journal write that fails means the scheduler can no longer keep its promise (persist
before acknowledging). For a submit, that is one refused job: the core forgets it and the
client gets an error. For anything else the actor raises, which stops the process; the
supervisor restarts it and the journal, which never ran ahead of what clients saw, is
replayed.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka
from loguru import logger

from uniun.actors.observe import Observation
from uniun.actors.scheduler.core import SchedulerCore
from uniun.actors.scheduler.effects import KEEP_TIMER, Effects
from uniun.actors.scheduler.front_messages import (
    BatchDone,
    ClientBatch,
    ClientGone,
    ClientRequest,
    Outgoing,
)
from uniun.actors.scheduler.journal import Journal, JournalEntry
from uniun.actors.scheduler.runner_link import (
    FromRunner,
    RunnerDown,
    RunnerStats,
    RunnerUp,
    ToRunner,
)
from uniun.protocol import requests as rq
from uniun.protocol.power_state import PowerState

__all__ = ["SchedulerHost", "Wire", "Replay", "Drain", "Quiet", "RunnerLane"]

CHUNK = 64  # requests of a batch between two looks at the runner lane


class RunnerLane:
    """What the runner link tells the host, in its own FIFO (see the module docstring).

    Has the one method of an actor ref the link uses, ``tell``; it wakes the host with
    one message per drain, not one per report.
    """

    def __init__(self) -> None:
        self._queue: deque[Any] = deque()
        self._lock = threading.Lock()
        self._kicked = False
        self.host: pykka.ActorRef | None = None

    def tell(self, message: Any) -> None:
        self._queue.append(message)
        with self._lock:
            if self._kicked or self.host is None:
                return
            self._kicked = True
        self.host.tell(_LaneKick())

    def take(self) -> list[Any]:
        with self._lock:
            self._kicked = False
        out = []
        while self._queue:
            out.append(self._queue.popleft())
        return out

MAX_TIMER_S = 3600.0  # the longest one timer waits before the core is asked again


@dataclass(frozen=True)
class Wire:
    """The other two actors (told once, before any traffic)."""

    front: pykka.ActorRef
    link: pykka.ActorRef


@dataclass(frozen=True)
class Replay:
    """The journal's jobs after a restart (told once, before any traffic)."""

    entries: list[JournalEntry]


@dataclass(frozen=True)
class PowerRead:
    """The power watch read new device facts (``power_reader.py``)."""

    state: PowerState


@dataclass(frozen=True)
class Drain:
    """The scheduler is stopping: park the running job so its progress is exact."""


@dataclass(frozen=True)
class Quiet:
    """``ask`` (from the main thread, with a timeout): is nothing running any more?"""


@dataclass(frozen=True)
class _Wake:
    pass


@dataclass(frozen=True)
class _LaneKick:
    pass


class SchedulerHost(pykka.ThreadingActor):
    """See the module docstring."""

    def __init__(self, *, core: SchedulerCore, journal: Journal,
                 clock: Callable[[], float],
                 observe: Callable[[list[Observation]], None] | None = None,
                 lane: RunnerLane | None = None,
                 device: Callable[[bool], None] | None = None) -> None:
        super().__init__()
        self._lane = lane
        self._device = device  # DevicePublisher.set, or None (the yield signal is off)
        if lane is not None:
            lane.host = self.actor_ref
        self._core = core
        self._journal = journal
        self._observe = observe  # MetricSink.apply, or None (metrics off)
        self._clock = clock  # the policy's clock: wake_at is on it
        self._front: pykka.ActorRef | None = None
        self._link: pykka.ActorRef | None = None
        self._timer: threading.Timer | None = None
        self._wake_at: float | None = None

    def on_stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    # ---- dispatch -------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        out = self._dispatch(message)
        if self._device is not None:
            self._device(self._core.policy.interactive())
        return out

    def _dispatch(self, message: Any) -> Any:
        core = self._core
        self._drain_lane()
        if isinstance(message, _LaneKick):
            return None  # drained above
        if isinstance(message, ClientBatch):
            self._on_batch(message.requests)
            assert self._front is not None, "Wire must come before traffic"
            self._front.tell(BatchDone())
        elif isinstance(message, ClientRequest):
            self._on_client(message)
        elif isinstance(message, (FromRunner, RunnerUp, RunnerDown, RunnerStats)):
            self._dispatch_runner(message)  # without a lane they come in the mailbox
        elif isinstance(message, ClientGone):
            self._apply(core.client_gone(message.conn))
        elif isinstance(message, _Wake):
            self._wake_at, self._timer = None, None
        elif isinstance(message, PowerRead):
            self._apply(core.power_from_sysfs(message.state))
        elif isinstance(message, Drain):
            self._apply(core.drain())
        elif isinstance(message, Quiet):
            return core.quiet
        elif isinstance(message, Wire):
            self._front, self._link = message.front, message.link
            return None
        elif isinstance(message, Replay):
            self._apply(core.replay(message.entries))
            return None
        else:
            logger.warning("scheduler host: unexpected message {!r}", type(message).__name__)
            return None
        self._apply(core.pump())
        return None

    def _drain_lane(self) -> None:
        """Handle every runner message waiting in the lane (then pump once)."""
        if self._lane is None:
            return
        messages = self._lane.take()
        for message in messages:
            self._dispatch_runner(message)
        if messages:
            self._apply(self._core.pump())

    def _dispatch_runner(self, message: Any) -> None:
        core = self._core
        if isinstance(message, FromRunner):
            self._apply(core.report(message.report))
        elif isinstance(message, RunnerUp):
            self._apply(core.runner_up(message.hello))
        elif isinstance(message, RunnerDown):
            self._apply(core.runner_down(message.reason))
        elif isinstance(message, RunnerStats):
            self._apply(core.runner_stats(message.count, message.nbytes, message.trimmed,
                                          message.spilled))
        else:
            logger.warning("runner lane: unexpected message {!r}", type(message).__name__)

    def _on_batch(self, requests: list[ClientRequest]) -> None:
        """A batch in chunks: one journal transaction per chunk, the lane between."""
        for start in range(0, len(requests), CHUNK):
            if start:
                self._drain_lane()
            chunk = requests[start:start + CHUNK]
            results = [(msg, self._core.request(msg.conn, msg.request, msg.owner))
                       for msg in chunk]
            try:
                self._journal.write([w for _, fx in results for w in fx.journal])
            except Exception:  # noqa: BLE001 - any failure: redo the writes one by one
                # One bad write must not refuse the others: redo them one by one.
                results = [(msg, self._committed(msg, fx)) for msg, fx in results]
            for _, fx in results:
                self._send(fx)
            if start + CHUNK < len(requests):
                self._apply(self._core.pump())  # a chat first in the batch starts now

    def _committed(self, msg: ClientRequest, fx: Effects) -> Effects:
        try:
            self._journal.write(fx.journal)
        except Exception as err:
            if not isinstance(msg.request, rq.Submit):
                raise
            return self._core.accept_failed(msg.request.job.job_id, msg.conn, msg.request.id,
                                            repr(err))
        return fx

    def _on_client(self, msg: ClientRequest) -> None:
        fx = self._core.request(msg.conn, msg.request, msg.owner)
        try:
            self._journal.write(fx.journal)
        except Exception as err:
            if not isinstance(msg.request, rq.Submit):
                raise
            fx = self._core.accept_failed(msg.request.job.job_id, msg.conn, msg.request.id,
                                          repr(err))
        self._send(fx)

    # ---- output ---------------------------------------------------------------------

    def _apply(self, fx: Effects) -> None:
        """Journal first (committed), then messages, then commands, then the timer, then
        the metric observations."""
        self._journal.write(fx.journal)
        self._send(fx)

    def _send(self, fx: Effects) -> None:
        sends = fx.sends
        if self._core.watchers:  # the timeline and status, pushed to watching clients
            sends = [*sends, *self._core.watch_sends(fx.journal)]
        if sends:
            assert self._front is not None, "Wire must come before traffic"
            for send in sends:
                self._front.tell(Outgoing(send.conn, send.msg))
        if fx.commands:
            assert self._link is not None, "Wire must come before traffic"
            for command in fx.commands:
                self._link.tell(ToRunner(command))
        if fx.wake_at is not KEEP_TIMER:
            self._arm(fx.wake_at)
        due = self._core.watchers.due  # a status push held back: wake for it, no later
        if due is not None and (self._wake_at is None or due < self._wake_at):
            self._arm(due)
        if fx.observations and self._observe is not None:
            self._observe(fx.observations)

    def _arm(self, wake_at: float | None) -> None:
        if wake_at == self._wake_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake_at = wake_at
        if wake_at is not None:
            # Capped: a client's far deadline (1e308 is valid unix seconds) would make the
            # wait overflow and the timer thread die; an early ring just re-arms.
            delay = min(max(0.0, wake_at - self._clock()), MAX_TIMER_S)
            self._timer = threading.Timer(delay, self._ring)
            self._timer.daemon = True
            self._timer.start()

    def _ring(self) -> None:
        """Timer thread: only tells; the actor thread owns every field."""
        with contextlib.suppress(pykka.ActorDeadError):
            self.actor_ref.tell(_Wake())
