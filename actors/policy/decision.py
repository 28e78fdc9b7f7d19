"""What the policy tells its host to do, and what report methods answer.

The step contract between scheduler and runner (STYLE.md "What that means here" 3): a
small frozen record out of :meth:`decide`, a small report in. Each record carries
``wake_at``, the policy-clock time at which ``decide()`` should be asked again even if
nothing else happens (deadline promotion, slice expiry, T2 window roll, end of the chat
idle gap, affinity starvation bound); ``None`` means "only when something happens".
One timer in the host is all it takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Union

from uniun.protocol.messages import PAUSE_REASONS, PauseReason

__all__ = [
    "PAUSE_REASONS",
    "CancelOutcome",
    "Decision",
    "Idle",
    "PauseReason",
    "Preempt",
    "ReportOutcome",
    "Run",
]


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing to start or stop now: the runner is free with nothing runnable, or it is
    busy with the right job (or already asked to stop it)."""

    wake_at: float | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """Start ``job_id`` on the (free) runner.

    ``swap``: load ``model_id`` first (it is not the loaded model). ``resume``: the job
    was paused before; continue from its snapshot (or recompute prompt + tokens so far),
    never from scratch. ``token_grant``: the most tokens this dispatch may produce (the
    background governor); the runner stops itself there and reports ``paused`` with
    reason ``budget``. ``None`` = up to the job's own ``max_new_tokens``.
    """

    job_id: str
    model_id: str
    resume: bool
    swap: bool
    token_grant: int | None
    tier: int
    wake_at: float | None = None


@dataclass(frozen=True, slots=True)
class Preempt:
    """Pause the running job at its next token boundary, keeping its snapshot.

    The job stays "running" for the policy until the host reports ``on_paused`` (or
    ``on_finished`` if it finished first); the policy will not ask twice. ``for_job_id``
    is the job that is expected to run next (``None`` for a governor pause).
    """

    running_job_id: str
    for_job_id: str | None
    reason: PauseReason
    wake_at: float | None = None


Decision = Union[Idle, Run, Preempt]


class CancelOutcome(str, Enum):
    """What :meth:`cancel` did; the host acts on it."""

    REMOVED = "removed"          # was queued/paused: gone now (free its snapshot, if any)
    STOP_RUNNING = "stop_running"  # is running: tell the runner to stop at the next token,
    #                                then report on_cancelled (or on_finished if it won)
    NOT_FOUND = "not_found"      # no live job with that id (unknown, or already ended)


class ReportOutcome(str, Enum):
    """What a pause / failure report did to the job; the host tells the client."""

    REQUEUED = "requeued"        # back at the front of its tier; will resume
    HELD = "held"                # paused by the background governor: resumes on foreground
    CANCELLED = "cancelled"      # a cancel was pending: the job is cancelled now
    FAILED = "failed"            # ended with an error (send it to the client)
    CHAT_INTERRUPTED = "chat_interrupted"  # a chat stopped by something other than its own
    #                                       cancel: ended, send a retryable error, never re-run
