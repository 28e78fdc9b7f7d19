"""A job as the policy sees it: the client's ``JobSpec`` plus scheduling state.

Rules of this file:
- ``JobStatus`` is ordered; everything ``>= DONE`` is terminal (``status.finished``).
- Transitions are data (``_TRANSITIONS``); :meth:`PolicyJob.move` is the only way to
  change a status, and an event a status does not accept raises
  :class:`IllegalTransition`, naming the job, the status and the event. A host that
  reports ``on_finished`` for a job it was never told to run gets that error, and the
  policy's state is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from uniun.protocol.errors import InvalidField
from uniun.protocol.jobmap import JobSpec


class JobStatus(IntEnum):
    """Where a job is. Ordered: queued states, then running states, then terminal."""

    QUEUED = 1       # waiting, never run (or failed over and re-queued without a snapshot)
    PAUSED = 2       # waiting, has run before: resumes from its snapshot
    HELD = 3         # paused by the background governor; waits for lifecycle foreground
    RUNNING = 4      # on the runner
    STOPPING = 5     # on the runner, asked to pause at the next token boundary
    CANCELLING = 6   # on the runner, asked to stop for good
    DONE = 10
    CANCELLED = 11
    FAILED = 12

    @property
    def finished(self) -> bool:
        return self >= JobStatus.DONE

    @property
    def waiting(self) -> bool:
        return self <= JobStatus.HELD

    @property
    def on_runner(self) -> bool:
        return JobStatus.RUNNING <= self <= JobStatus.CANCELLING


_S = JobStatus
_TRANSITIONS: dict[tuple[JobStatus, str], JobStatus] = {
    (_S.QUEUED, "dispatch"): _S.RUNNING,
    (_S.PAUSED, "dispatch"): _S.RUNNING,
    (_S.QUEUED, "cancel"): _S.CANCELLED,
    (_S.PAUSED, "cancel"): _S.CANCELLED,
    (_S.HELD, "cancel"): _S.CANCELLED,
    (_S.HELD, "release"): _S.PAUSED,
    (_S.RUNNING, "preempt"): _S.STOPPING,
    (_S.RUNNING, "cancel"): _S.CANCELLING,
    (_S.STOPPING, "cancel"): _S.CANCELLING,
    (_S.RUNNING, "pause"): _S.PAUSED,
    (_S.STOPPING, "pause"): _S.PAUSED,
    (_S.RUNNING, "hold"): _S.HELD,
    (_S.STOPPING, "hold"): _S.HELD,
    (_S.RUNNING, "requeue"): _S.QUEUED,
    (_S.STOPPING, "requeue"): _S.QUEUED,
    (_S.CANCELLING, "requeue"): _S.CANCELLED,
    (_S.RUNNING, "finish"): _S.DONE,
    (_S.STOPPING, "finish"): _S.DONE,
    (_S.CANCELLING, "finish"): _S.DONE,
    (_S.RUNNING, "fail"): _S.FAILED,
    (_S.STOPPING, "fail"): _S.FAILED,
    (_S.CANCELLING, "fail"): _S.FAILED,
    (_S.RUNNING, "cancelled"): _S.CANCELLED,
    (_S.STOPPING, "cancelled"): _S.CANCELLED,
    (_S.CANCELLING, "cancelled"): _S.CANCELLED,
    (_S.CANCELLING, "pause"): _S.CANCELLED,
}


class PolicyError(Exception):
    """Local misuse of the policy by its host (not bad client input)."""


class IllegalTransition(PolicyError):
    """A report or command that the job's current status does not accept."""

    def __init__(self, job_id: str, status: JobStatus, event: str) -> None:
        super().__init__(f"job {job_id!r}: cannot {event} while {status.name}")
        self.job_id = job_id
        self.status = status
        self.event = event


class UnknownJob(PolicyError):
    """A runner report names a job the policy does not know (or that already ended)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no live job {job_id!r}")
        self.job_id = job_id


class DuplicateJob(InvalidField):
    """``submit`` of a job_id that is still live. Client input: a wire error."""

    def __init__(self, job_id: str) -> None:
        super().__init__("job_id", f"a job with id {job_id!r} is already queued or running",
                         job_id=job_id)


@dataclass(eq=False, slots=True)
class PolicyJob:
    """A live job and everything the policy tracks about it."""

    spec: JobSpec
    arrival: float               # policy-clock time of submit
    deadline_at: float | None    # policy-clock time of the wire's deadline
    key: int                     # FIFO key in its tier: smaller goes first (front < 0)
    status: JobStatus = JobStatus.QUEUED
    waiting_since: float = 0.0   # when it last entered the queue (for starvation)
    tokens: int = 0              # tokens generated so far, all dispatches together
    runner_s: float = 0.0        # runner seconds consumed so far
    dispatches: int = 0
    pauses: int = 0
    dispatch_tier: int = 4       # tier it had when last dispatched
    dispatched_at: float = 0.0   # when the current dispatch was decided
    segment_start: float | None = None  # when the runner started it (on_started)
    last_report_at: float | None = None  # last runner report of this dispatch
    grant: int | None = None     # token grant of this dispatch (None = no limit)
    dispatch_tokens: int = 0     # tokens produced in this dispatch
    first_token_at: float | None = None
    stop_reason: str | None = None  # reason of the pending Preempt
    client: str = ""             # who it is served for: T0's fair-share key (chatshare.py)
    prompt_charged: bool = False  # its prompt is on its client's counter (once per job)

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def flow(self) -> str:
        return self.spec.flow or self.spec.kind

    @property
    def model_id(self) -> str:
        return self.spec.model_id

    def move(self, event: str) -> JobStatus:
        """Apply ``event``; raise :class:`IllegalTransition` (nothing changed) if the
        current status does not accept it."""
        new = _TRANSITIONS.get((self.status, event))
        if new is None:
            raise IllegalTransition(self.job_id, self.status, event)
        self.status = new
        return new

    def accepts(self, event: str) -> bool:
        return (self.status, event) in _TRANSITIONS

    def summary(self) -> dict[str, object]:
        """The running-job summary of ``status()``."""
        return {
            "job_id": self.job_id, "kind": self.kind, "flow": self.flow,
            "model_id": self.model_id, "tier": self.dispatch_tier,
            "status": self.status.name.lower(), "tokens": self.tokens,
            "runner_s": round(self.runner_s, 6), "stopping": self.stop_reason,
        }
