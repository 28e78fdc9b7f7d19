"""What every policy shares: the live jobs, their status transitions, the runner reports.

A policy subclass decides *which* job and *when*; this class keeps the facts straight:
a job is submitted once, is on the runner at most once at a time, and ends exactly once
(done, cancelled or failed). Every entry point validates first and changes state after,
so a rejected call leaves the policy as it was.

Time: every method reads the injected ``clock`` (monotonic seconds in production, a fake
in tests). Wire deadlines (docs/protocol.md) are unix wall-clock seconds; ``submit`` converts one
once, as ``clock() + (deadline - wall_clock())``, so the policy only ever compares
policy-clock times. Pass ``wall_clock=clock`` where both are the same clock (tests, the
trace simulator).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from uniun.actors.policy.config import PolicyConfig
from uniun.actors.policy.decision import (
    PAUSE_REASONS,
    CancelOutcome,
    Decision,
    ReportOutcome,
)
from uniun.actors.policy.job import (
    DuplicateJob,
    IllegalTransition,
    JobStatus,
    PolicyError,
    PolicyJob,
    UnknownJob,
)
from uniun.actors.policy.power import PowerGovernor
from uniun.protocol.errors import InvalidField
from uniun.protocol.jobmap import JobSpec
from uniun.protocol.power_state import PowerState

Clock = Callable[[], float]
LIFECYCLES = ("foreground", "background")
_TRANSITION_EVENTS = frozenset({"pause", "finish", "fail", "cancelled"})


class PolicyBase(ABC):
    """Job bookkeeping and runner reports; subclasses implement the queue and the pick."""

    name: str = "?"

    def __init__(self, config: PolicyConfig | None = None, clock: Clock | None = None,
                 wall_clock: Clock | None = None) -> None:
        import time

        self.config = config if config is not None else PolicyConfig()
        self._clock: Clock = clock if clock is not None else time.monotonic
        self._wall: Clock = wall_clock if wall_clock is not None else time.time
        self._jobs: dict[str, PolicyJob] = {}
        self._running: PolicyJob | None = None
        self.loaded_model: str | None = None
        self.foreground: str | None = None
        self.lifecycle = "foreground"
        self.swaps = 0
        self.preemptions = 0
        # Live jobs per (kind, foreground_hint): interactive() in O(1) under any backlog.
        self._kinds: dict[tuple[str, bool], int] = {}
        # The power governor (docs/device.md), and what it decided since the host last
        # looked: (job_id or None, why), drained into timeline marks by the scheduler.
        self.power = PowerGovernor(self.config, self._clock())
        self.power_notes: list[tuple[str | None, str]] = []

    # --- the subclass's part ---------------------------------------------------------------
    @abstractmethod
    def decide(self) -> Decision:
        """What the host should do now (see :mod:`uniun.actors.policy.decision`)."""

    @abstractmethod
    def status(self) -> dict[str, Any]:
        """The ``status`` reply fields (docs/protocol.md) this policy knows."""

    @abstractmethod
    def tier(self, job: PolicyJob, now: float) -> int:
        """The job's tier at ``now`` (reported in ``accepted`` and ``started``)."""

    @abstractmethod
    def _enqueue(self, job: PolicyJob, *, front: bool) -> None:
        """Put a waiting job in the queue (``front``: a paused job, goes first)."""

    @abstractmethod
    def _dequeue(self, job: PolicyJob) -> None:
        """Take a waiting job (queued, paused or held) out of the queue: cancelled."""

    def _arrived(self, job: PolicyJob, now: float) -> None:
        """Hook: a job was accepted."""

    def _charged(self, job: PolicyJob, runner_s: float, now: float) -> None:
        """Hook: ``job`` consumed ``runner_s`` seconds of runner time."""

    def _ended(self, job: PolicyJob, now: float) -> None:
        """Hook: ``job`` reached a terminal status."""

    def _served(self, job: PolicyJob, prompt_tokens: int, tokens: int) -> None:
        """Hook: the runner served ``job`` that much prompt and that many new tokens."""

    def _requeue_chat(self, job: PolicyJob) -> bool:
        """Hook: does this pause of a chat put it back in the queue (the policy asked for
        it, to give the runner to another client's chat) instead of ending it?"""
        return False

    def _hold(self, job: PolicyJob, reason: str) -> bool:
        """Hook: should this pause hold the job (background governor) instead of
        re-queueing it?"""
        return False

    def queue_depths(self) -> list[int]:
        """Waiting jobs (queued, paused, held) per tier 0..4 now, for the queue-depth
        metric: one pass over the live jobs, no sorting (``status()`` sorts)."""
        now = self._clock()
        depths = [0, 0, 0, 0, 0]
        for job in self._jobs.values():
            if job.status.waiting:
                depths[self.tier(job, now)] += 1
        return depths

    # --- commands ------------------------------------------------------------------------
    def submit(self, spec: JobSpec, *, arrival: float | None = None,
               deadline_at: float | None = None, client: str | None = None) -> int:
        """Accept a validated job; return its tier now.

        ``arrival``: policy-clock time it arrived (default now; a journal replay passes
        the original). ``deadline_at``: the deadline on the policy clock, if the host
        converted it itself; otherwise ``spec.deadline`` (unix seconds) is converted.
        ``client``: who the job is served for, the key of T0's fair shares (the host
        knows the submitter; default ``spec.client``, and jobs without one are one
        client).
        Raises :class:`InvalidField` (naming the field; :class:`DuplicateJob` for a live
        ``job_id``) and changes nothing.
        """
        now = self._clock()
        _check_spec(spec)
        if spec.job_id in self._jobs:
            raise DuplicateJob(spec.job_id)
        if arrival is not None and not _finite(arrival):
            raise InvalidField("arrival", "must be a finite number", job_id=spec.job_id)
        if deadline_at is None and spec.deadline is not None:
            deadline_at = now + (spec.deadline - self._wall())
        if deadline_at is not None and not _finite(deadline_at):
            raise InvalidField("deadline", "must be a finite time", job_id=spec.job_id)
        if client is not None and not isinstance(client, str):
            raise InvalidField("client", "must be a string", job_id=spec.job_id)
        job = PolicyJob(spec=spec, arrival=now if arrival is None else float(arrival),
                        deadline_at=deadline_at, key=0, waiting_since=now,
                        client=spec.client if client is None else client)
        self._jobs[spec.job_id] = job
        key = (spec.kind, bool(spec.foreground_hint))
        self._kinds[key] = self._kinds.get(key, 0) + 1
        self._arrived(job, now)
        self._enqueue(job, front=False)
        return self.tier(job, now)

    def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel a job: removed if waiting, stopped at the next token if running."""
        job = self._jobs.get(job_id)
        if job is None:
            return CancelOutcome.NOT_FOUND
        if job.status.on_runner:
            if job.status is not JobStatus.CANCELLING:
                job.move("cancel")
            return CancelOutcome.STOP_RUNNING
        self._dequeue(job)
        job.move("cancel")
        self._end(job, self._clock())
        return CancelOutcome.REMOVED

    def set_foreground(self, kind: str | None) -> None:
        """The kind whose surface the user is looking at (``None``: none)."""
        if kind is not None and (not isinstance(kind, str) or not kind):
            raise InvalidField("kind", "must be a non-empty string or nil")
        self.foreground = kind

    def set_lifecycle(self, state: str) -> None:
        """``"foreground"`` (full budgets) or ``"background"`` (25 % grants)."""
        if state not in LIFECYCLES:
            raise InvalidField("state", "must be \"foreground\" or \"background\"")
        if state != self.lifecycle:
            self.lifecycle = state
            self._lifecycle_changed(state)

    def _lifecycle_changed(self, state: str) -> None:
        """Hook: the lifecycle changed."""

    def set_power(self, state: PowerState) -> bool:
        """The device's power facts (charger, battery, heat); return whether the
        governor's mode changed (a note says so, with the reason)."""
        if not isinstance(state, PowerState):
            raise PolicyError("power must be a PowerState")
        changed = self.power.set_state(state, self._clock())
        if changed:
            self.power_notes.append((None, f"{self.power.mode}: {self.power.reason}"))
        return changed

    def power_status(self) -> dict[str, Any]:
        """The governor's mode, its reason, the background share and what is saved up."""
        return self.power.status(self._clock())

    def take_power_notes(self) -> list[tuple[str | None, str]]:
        """The governor's decisions since the last call (for the timeline)."""
        notes, self.power_notes = self.power_notes, []
        return notes

    # --- runner reports --------------------------------------------------------------------
    def on_model_loaded(self, model_id: str) -> None:
        """The runner has ``model_id`` loaded (at start, or after a swap it did)."""
        if not isinstance(model_id, str) or not model_id:
            raise PolicyError("model_id must be a non-empty string")
        self.loaded_model = model_id

    def on_started(self, job_id: str, prompt_tokens: int = 0) -> None:
        """The runner began work on the job it was told to run (after any swap).
        ``prompt_tokens``: the prompt's length, charged to the job's client once."""
        job = self._on_runner(job_id, "started")
        if not isinstance(prompt_tokens, int) or prompt_tokens < 0:
            raise PolicyError(f"prompt_tokens must be an int >= 0 (got {prompt_tokens!r})")
        now = self._clock()
        job.segment_start = job.last_report_at = now
        if prompt_tokens and not job.prompt_charged:
            job.prompt_charged = True
            self._served(job, prompt_tokens, 0)

    def on_tokens(self, job_id: str, n_new_tokens: int, runner_seconds: float) -> None:
        """``n_new_tokens`` more tokens; ``runner_seconds`` consumed since the last report."""
        job = self._on_runner(job_id, "tokens")
        if not isinstance(n_new_tokens, int) or n_new_tokens < 0:
            raise PolicyError(f"n_new_tokens must be an int >= 0 (got {n_new_tokens!r})")
        seconds = _seconds(runner_seconds)
        now = self._clock()
        if job.segment_start is None:  # a host that skipped on_started
            job.segment_start = job.last_report_at = now
        if n_new_tokens and job.first_token_at is None:
            job.first_token_at = now
        job.tokens += n_new_tokens
        job.dispatch_tokens += n_new_tokens
        if n_new_tokens:
            self._served(job, 0, n_new_tokens)
        self._charge(job, seconds, now)

    def on_paused(self, job_id: str, runner_seconds: float, reason: str) -> ReportOutcome:
        """The running job stopped at a token boundary with its snapshot kept."""
        job = self._on_runner(job_id, "pause")
        if reason not in PAUSE_REASONS:
            raise PolicyError(f"unknown pause reason {reason!r}")
        seconds = _seconds(runner_seconds)
        now = self._clock()
        self._charge(job, seconds, now)
        self._running = None
        job.pauses += 1
        if job.status is JobStatus.CANCELLING:
            job.move("pause")
            self._end(job, now)
            return ReportOutcome.CANCELLED
        if job.kind == self.config.chat_kind and not self._requeue_chat(job):
            job.move("fail")
            self._end(job, now)
            return ReportOutcome.CHAT_INTERRUPTED
        held = self._hold(job, reason)
        job.move("hold" if held else "pause")
        self._clear_dispatch(job)
        job.waiting_since = now
        if held:
            return ReportOutcome.HELD
        self._enqueue(job, front=True)
        return ReportOutcome.REQUEUED

    def on_finished(self, job_id: str, runner_seconds: float) -> None:
        """The job produced its last token (stop or length)."""
        job = self._on_runner(job_id, "finish")
        now = self._clock()
        self._charge(job, _seconds(runner_seconds), now)
        job.move("finish")
        self._running = None
        self._end(job, now)

    def on_failed(self, job_id: str, runner_seconds: float, *,
                  requeue: bool = False) -> ReportOutcome:
        """The runner could not continue the job. With ``requeue`` (e.g. the runner
        process died and was restarted), a non-chat job goes back to the front of its
        tier to be resumed by recomputation; a chat always ends (retryable error)."""
        job = self._on_runner(job_id, "fail")
        now = self._clock()
        self._charge(job, _seconds(runner_seconds), now)
        self._running = None
        if requeue and job.kind != self.config.chat_kind:
            if job.move("requeue") is JobStatus.CANCELLED:
                self._end(job, now)
                return ReportOutcome.CANCELLED
            self._clear_dispatch(job)
            job.waiting_since = now
            self._enqueue(job, front=True)
            return ReportOutcome.REQUEUED
        job.move("fail")
        self._end(job, now)
        return ReportOutcome.FAILED

    def on_cancelled(self, job_id: str, runner_seconds: float) -> None:
        """The runner stopped the job for good (after ``cancel``)."""
        job = self._on_runner(job_id, "cancelled")
        now = self._clock()
        self._charge(job, _seconds(runner_seconds), now)
        job.move("cancelled")
        self._running = None
        self._end(job, now)

    # --- queries ----------------------------------------------------------------------------
    def job(self, job_id: str) -> PolicyJob | None:
        """The live job with this id (read it, do not change it), or ``None``."""
        return self._jobs.get(job_id)

    @property
    def running(self) -> PolicyJob | None:
        return self._running

    def interactive(self) -> bool:
        """Is interactive work (a T0 chat or a T1 foreground job) running or waiting?

        What the scheduler publishes to the processes that compute outside the runner
        (docs/device.md): while it is true they start no new batch.
        """
        kinds, fg = self._kinds, self.foreground
        if self.live_chats():
            return True
        if fg is None:
            return False
        if fg == self.config.extract_kind:  # extract is T1 only with the hint
            return bool(kinds.get((fg, True)))
        return bool(kinds.get((fg, False)) or kinds.get((fg, True)))

    def live_chats(self) -> int:
        """Chats (T0) queued, running or paused now."""
        chat = self.config.chat_kind
        return self._kinds.get((chat, False), 0) + self._kinds.get((chat, True), 0)

    def live_count(self) -> int:
        return len(self._jobs)

    # --- helpers ----------------------------------------------------------------------------
    def _on_runner(self, job_id: str, event: str) -> PolicyJob:
        """The running job ``job_id``, checked to accept ``event``."""
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        if job is not self._running or (event in _TRANSITION_EVENTS
                                        and not job.accepts(event)):
            raise IllegalTransition(job_id, job.status, event)
        return job

    def _charge(self, job: PolicyJob, seconds: float, now: float) -> None:
        job.runner_s += seconds
        job.last_report_at = now
        if seconds > 0:
            self._charged(job, seconds, now)

    def _dispatched(self, job: PolicyJob, now: float, tier: int,
                    grant: int | None) -> bool:
        """Mark ``job`` as given to the runner; return whether that needs a swap."""
        job.move("dispatch")
        job.dispatches += 1
        job.dispatch_tier = tier
        job.dispatched_at = now
        job.grant = grant
        self._running = job
        swap = job.model_id != self.loaded_model
        if swap:
            self.swaps += 1
            self.loaded_model = job.model_id
        return swap

    @staticmethod
    def _clear_dispatch(job: PolicyJob) -> None:
        job.segment_start = job.last_report_at = None
        job.grant = None
        job.dispatch_tokens = 0
        job.stop_reason = None

    def _end(self, job: PolicyJob, now: float) -> None:
        del self._jobs[job.job_id]
        key = (job.kind, bool(job.spec.foreground_hint))
        left = self._kinds.get(key, 0) - 1
        if left > 0:
            self._kinds[key] = left
        else:
            self._kinds.pop(key, None)
        self._ended(job, now)


def _check_spec(spec: JobSpec) -> None:
    if not isinstance(spec, JobSpec):
        raise InvalidField("job", "must be a validated JobSpec (see protocol.jobmap)")
    for name in ("job_id", "kind", "model_id"):
        value = getattr(spec, name)
        if not isinstance(value, str) or not value:
            raise InvalidField(name, "must be a non-empty string")
    if (not isinstance(spec.max_new_tokens, int) or isinstance(spec.max_new_tokens, bool)
            or spec.max_new_tokens < 1):
        raise InvalidField("max_new_tokens", "must be an integer >= 1", job_id=spec.job_id)
    if spec.deadline is not None and not _finite(spec.deadline):
        raise InvalidField("deadline", "must be unix seconds or nil", job_id=spec.job_id)


def _finite(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _seconds(value: object) -> float:
    if not _finite(value) or value < 0:  # type: ignore[operator]
        raise PolicyError(f"runner_seconds must be a finite number >= 0 (got {value!r})")
    return float(value)  # type: ignore[arg-type]
