"""The scheduler core's state, and the one way a job ends (the base of the core).

:class:`CoreState` holds what the scheduler knows: the policy (scheduling state), the job
table (everything else about a job as clients see it), the runner we work with, and the
snapshot totals it reported. The two halves of :class:`~uniun.actors.scheduler.core.
SchedulerCore` build on it: the client requests (``core_requests.py``) and the runner's
reports and the decisions (``core.py``). Pure: the clocks are injected, nothing is read
or written but these fields.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from loguru import logger

from uniun.actors.policy import PolicyBase
from uniun.actors.scheduler.admission import CHAT_RESERVE_SHARE, CLIENT_SHARE, QueueBounds
from uniun.actors.scheduler.dead_letters import DeadLetters
from uniun.actors.scheduler.effects import Effects, JFinish, Send
from uniun.actors.scheduler.jobs import JobRecord, JobTable
from uniun.actors.scheduler.recorder import Recorder
from uniun.actors.scheduler.watchers import Watchers
from uniun.protocol import messages as m, runner_records as rp
from uniun.protocol.errors import ErrorCode

__all__ = ["CoreState", "Clock", "cancelled_event"]

Clock = Callable[[], float]


def cancelled_event(job_id: str) -> dict[str, Any]:
    return m.event_error(job_id, ErrorCode.CANCELLED, "cancelled by the client")


class CoreState:
    """See the module docstring.

    ``clock``: the policy's clock (monotonic seconds; ``wake_at`` is on it).
    ``wall``: unix seconds, for what is journaled and reported to clients.
    ``processes``: name -> pid of the runtime's processes, for ``status``.
    ``process_info``: name -> {pid, cpu_percent, rss_bytes, restarts}, for ``status``.
    ``segments`` / ``metrics``: record the timeline / make metric observations
    (:class:`~uniun.actors.scheduler.recorder.Recorder`).
    ``quarantined``: the databases this runtime found corrupt at start, for ``status``.
    ``dead_letters``: the jobs the journal replay moved aside, for ``status`` and ``attach``.
    ``chat_reserve_share`` / ``client_share``: the queue's bounds beside ``queue_cap``
    (:class:`~uniun.actors.scheduler.admission.QueueBounds`).
    """

    def __init__(self, *, policy: PolicyBase, queue_cap: int, clock: Clock, wall: Clock,
                 processes: Callable[[], dict[str, int]] = dict,
                 process_info: Callable[[], dict[str, Any]] = dict,
                 segments: bool = True, metrics: bool = True,
                 quarantined: Sequence[Mapping[str, Any]] = (),
                 dead_letters: DeadLetters | None = None,
                 chat_reserve_share: float = CHAT_RESERVE_SHARE,
                 client_share: float = CLIENT_SHARE) -> None:
        self.policy = policy
        self.queue_cap = queue_cap
        self.bounds = QueueBounds(queue_cap, chat_reserve_share, client_share)
        self._clock = clock
        self._wall = wall
        self._processes = processes
        self._process_info = process_info
        self.quarantined = tuple(quarantined)  # databases moved aside at start (status)
        self.dead_letters = dead_letters or DeadLetters()  # jobs replay could not use
        self.watchers = Watchers(clock)  # clients following the state (``watch``)
        self.rec = Recorder(wall=wall, clock=clock, chat_kind=policy.config.chat_kind,
                            segments=segments, metrics=metrics)
        self.jobs = JobTable(chat_kind=policy.config.chat_kind)
        self.runner: rp.Hello | None = None  # the runner we work with, if one is up
        self.snapshots = (0, 0)  # parked snapshots on the runner: count, bytes
        self.draining = False
        # Bumped by every input that may change what ``status`` shows: a status body is
        # reused only while it is unchanged (and young), see ``_status``.
        self.changes = 0
        self._status_cache: tuple[float, int, dict[str, Any]] | None = None  # at, changes
        self._procs_cache: tuple[float, dict[str, int], dict[str, Any]] | None = None

    # ---- queries --------------------------------------------------------------------

    @property
    def quiet(self) -> bool:
        """Nothing runs any more (or there is no runner to run it)."""
        return self.policy.running is None or self.runner is None

    # ---- output ---------------------------------------------------------------------

    @staticmethod
    def _emit(fx: Effects, record: JobRecord, msg: dict[str, Any]) -> None:
        fx.sends.extend(Send(conn, msg) for conn in record.subscribers)

    def _end(self, fx: Effects, record: JobRecord, final: dict[str, Any]) -> None:
        """End a job once: journal the end, then tell every subscriber."""
        if record.final is not None:
            logger.bind(job=record.job_id).warning("second end ({}) ignored",
                                                   final.get("type"))
            return
        fx.journal.append(JFinish(record.job_id, final, self._wall()))
        self.rec.ended(fx, record, final)
        self._emit(fx, record, final)
        self.jobs.end(record, final)
        logger.bind(job=record.job_id).info("ended: {}", final.get("finish_reason")
                                            or final.get("code"))
