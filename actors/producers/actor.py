"""The pykka actor that hosts one producer, and the process entry that runs it.

A producer's logic is a plain object with ``step(now)`` (decide and submit new work),
an optional ``tracker`` (its :class:`~uniun.actors.producers.jobs.JobTracker`) and
``close()``. The actor only drives it: each ``tick`` message pumps the tracker's job
events for up to ``pump_s`` seconds, calls ``step``, and tells itself the next tick. So
the protocol client and the database connection are used from the actor's thread only,
and a ``stop`` (SIGTERM) is handled between two ticks.

Failure semantics (pykka's, at the process level): an exception in a tick stops the
actor and sets ``failed``; the process entry (``runtime.producers_main``) then exits 1
and the supervisor restarts it. Everything a producer needs to carry on is in the
results database, so a restart loses nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import pykka
from loguru import logger

_TICK = "tick"


class ProducerLogic(Protocol):
    name: str

    def step(self, now: float) -> None: ...

    def close(self) -> None: ...


class ProducerActor(pykka.ThreadingActor):
    """Ticks a producer's logic; see the module docstring."""

    def __init__(self, make_logic: Callable[[], ProducerLogic], *, pump_s: float = 0.2,
                 failed: threading.Event | None = None,
                 finished: threading.Event | None = None) -> None:
        super().__init__()
        self._make_logic = make_logic
        self.logic: ProducerLogic | None = None
        self.pump_s = pump_s
        self.failed = failed or threading.Event()  # set when start-up or a tick raised
        # Set last, once the actor is done (stopped or failed, logic closed): pykka marks
        # the actor dead *before* on_failure runs, so "not alive" alone cannot tell a
        # watcher whether ``failed`` is final yet.
        self.finished = finished or threading.Event()

    def on_start(self) -> None:
        # Built here, in the actor's thread: the logic's ZeroMQ sockets and database
        # connection are then created and used by one thread only.
        try:
            self.logic = self._make_logic()
        except Exception:
            self.failed.set()  # pykka calls no on_failure for on_start: say it here
            logger.exception("the producer could not start")
            self.finished.set()
            raise
        logger.info("{} producer started", self.logic.name)
        self.actor_ref.tell(_TICK)

    def on_receive(self, message: Any) -> Any:
        if message != _TICK:
            logger.warning("ignored unknown message {!r}", message)
            return None
        assert self.logic is not None
        tracker = getattr(self.logic, "tracker", None)
        if tracker is not None:
            tracker.pump(self.pump_s)
        else:
            time.sleep(self.pump_s)
        self.logic.step(time.time())
        self.actor_ref.tell(_TICK)
        return None

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        # pykka has already marked the actor dead here; ``failed`` and then ``finished``
        # are set after the close, so a watcher that waits on ``finished`` (the process
        # entry does) reads a final ``failed`` and finds the logic closed.
        logger.opt(exception=(exception_type, exception_value, traceback)).error(
            "{} producer failed", getattr(self.logic, "name", "a"))
        self._close()
        self.failed.set()
        self.finished.set()

    def on_stop(self) -> None:
        if self.logic is not None:
            logger.info("{} producer stopping", self.logic.name)
        self._close()
        self.finished.set()

    def _close(self) -> None:
        if self.logic is None:
            return
        try:
            self.logic.close()
        except Exception:
            logger.exception("closing {} failed", self.logic.name)
