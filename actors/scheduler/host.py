"""The scheduler host actor: feeds the scheduler core and carries out what it returns.

Thin by design (STYLE.md lesson 7): every message is turned into one call of
:class:`~uniun.actors.scheduler.core.SchedulerCore`, followed by ``core.pump()``; the
:class:`~uniun.actors.scheduler.effects.Effects` that come back are applied in their fixed
order — journal writes committed first, then client messages told to the front, then
runner commands told to the link — and the core's ``wake_at`` arms the one timer. Nothing
here decides anything, blocks, or asks another actor.

A journal write that fails means the scheduler can no longer keep its promise (persist
before acknowledging). For a submit, that is one refused job: the core forgets it and the
client gets an error. For anything else the actor raises, which stops the process; the
supervisor restarts it and the journal, which never ran ahead of what clients saw, is
replayed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka
from loguru import logger

from uniun.actors.observe import Observation
from uniun.actors.scheduler.core import SchedulerCore
from uniun.actors.scheduler.effects import KEEP_TIMER, Effects
from uniun.actors.scheduler.front import ClientGone, ClientRequest, Outgoing
from uniun.actors.scheduler.journal import Journal, JournalEntry
from uniun.actors.scheduler.runner_link import (
    FromRunner,
    RunnerDown,
    RunnerStats,
    RunnerUp,
    ToRunner,
)
from uniun.protocol import requests as rq

__all__ = ["SchedulerHost", "Wire", "Replay", "Drain", "Quiet"]

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
class Drain:
    """The scheduler is stopping: park the running job so its progress is exact."""


@dataclass(frozen=True)
class Quiet:
    """``ask`` (from the main thread, with a timeout): is nothing running any more?"""


@dataclass(frozen=True)
class _Wake:
    pass


class SchedulerHost(pykka.ThreadingActor):
    """See the module docstring."""

    def __init__(self, *, core: SchedulerCore, journal: Journal,
                 clock: Callable[[], float],
                 observe: Callable[[list[Observation]], None] | None = None) -> None:
        super().__init__()
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
        core = self._core
        if isinstance(message, ClientRequest):
            self._on_client(message)
        elif isinstance(message, FromRunner):
            self._apply(core.report(message.report))
        elif isinstance(message, RunnerUp):
            self._apply(core.runner_up(message.hello))
        elif isinstance(message, RunnerDown):
            self._apply(core.runner_down(message.reason))
        elif isinstance(message, RunnerStats):
            self._apply(core.runner_stats(message.count, message.nbytes, message.trimmed,
                                          message.spilled))
        elif isinstance(message, ClientGone):
            self._apply(core.client_gone(message.conn))
        elif isinstance(message, _Wake):
            self._wake_at, self._timer = None, None
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

    def _on_client(self, msg: ClientRequest) -> None:
        fx = self._core.request(msg.conn, msg.request)
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
        if fx.sends:
            assert self._front is not None, "Wire must come before traffic"
            for send in fx.sends:
                self._front.tell(Outgoing(send.conn, send.msg))
        if fx.commands:
            assert self._link is not None, "Wire must come before traffic"
            for command in fx.commands:
                self._link.tell(ToRunner(command))
        if fx.wake_at is not KEEP_TIMER:
            self._arm(fx.wake_at)
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
        try:
            self.actor_ref.tell(_Wake())
        except pykka.ActorDeadError:
            pass
