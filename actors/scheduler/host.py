"""The policy-host actor: the scheduler's one place of decision.

Theory of operation (vLLM's glue loop, in actor form). Every input — a client request
from the front, a runner report or runner up/down from the link, the wake-up timer —
is one message. The handler updates the policy (pure, clock-injected), the job table and
the journal, sends the replies and job events, and then *pumps*: ``policy.decide()``
until it says ``Idle``, turning each ``Run`` / ``Preempt`` into runner commands. The
policy's ``wake_at`` arms the single timer. Nothing here blocks and nothing asks another
actor: replies and events go out with ``tell``.

Persist before acknowledging: a job is journaled (and committed) before ``accepted`` is
sent; each streamed token is journaled before it is forwarded; a job's end is journaled
before its terminal event. So after a crash the journal is never behind what a client
saw (:mod:`uniun.runtime.journal`).

Runner failure: when the link reports the runner down, the job on it is failed over —
a chat ends with a retryable ``runner_failed`` error (never silently re-run), any other
job goes back to the front of its tier and continues on the next runner from a spilled
snapshot or by recompute, after the tokens it already streamed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import pykka
from loguru import logger

from uniun.actors.front import ClientGone, ClientRequest, Outgoing
from uniun.actors.host_requests import ClientRequests
from uniun.actors.jobs import JobRecord, JobTable, done_event, start_command
from uniun.actors.policy.decision import Idle, Preempt, ReportOutcome, Run
from uniun.actors.policy.job import PolicyError
from uniun.actors.runner_link import FromRunner, RunnerDown, RunnerStats, RunnerUp, ToRunner
from uniun.protocol import messages as m
from uniun.protocol.errors import ErrorCode
from uniun.runtime import runner_protocol as rp
from uniun.runtime.journal import Journal, JournalEntry

__all__ = ["PolicyHost", "Wire", "Replay", "Drain", "Quiet"]


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


class PolicyHost(ClientRequests, pykka.ThreadingActor):
    """See the module docstring."""

    def __init__(self, *, policy: Any, journal: Journal, queue_cap: int,
                 clock: Callable[[], float] = time.monotonic,
                 processes: Callable[[], dict[str, int]] | None = None) -> None:
        super().__init__()
        self._policy = policy
        self._clock = clock  # the policy's clock: wake_at is on it
        self._journal = journal
        self._queue_cap = queue_cap
        self._processes = processes or (lambda: {})
        self._jobs = JobTable()
        self._front: pykka.ActorRef | None = None
        self._link: pykka.ActorRef | None = None
        self._runner: rp.Hello | None = None
        self._snapshots = (0, 0)
        self._timer: threading.Timer | None = None
        self._wake_at: float | None = None
        self._draining = False

    def on_stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    # ---- dispatch -------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        handler = self._HANDLERS.get(type(message))
        if handler is None:
            logger.warning("policy host: unexpected message {!r}", type(message).__name__)
            return None
        result = handler(self, message)
        if not isinstance(message, (Quiet, Wire, Replay)):
            self._pump()
        return result

    def _on_wire(self, msg: Wire) -> None:
        self._front, self._link = msg.front, msg.link

    def _on_replay(self, msg: Replay) -> None:
        """Rebuild the job table and the policy's queue from the journal."""
        now, wall = self._clock(), time.time()
        chat = self._policy.config.chat_kind
        for e in msg.entries:
            record = JobRecord(spec=e.spec, accepted_at=e.accepted_at, seed=e.seed,
                               started=e.started, started_at=e.started_at,
                               first_token_at=e.first_token_at, preemptions=e.preemptions,
                               token_ids=e.token_ids, texts=e.texts)
            if e.final is not None:
                self._jobs.end(record, e.final)
            elif e.spec.kind == chat and e.started:
                self._end(record, m.event_error(
                    e.spec.job_id, ErrorCode.RUNNER_FAILED,
                    "the scheduler restarted during this chat; retry", retryable=True))
            else:
                try:
                    record.tier = self._policy.submit(e.spec,
                                                      arrival=now - (wall - e.accepted_at))
                except Exception as err:  # one bad row must not crash-loop the scheduler
                    logger.bind(job=e.spec.job_id).exception("cannot replay this job")
                    self._end(record, m.event_error(e.spec.job_id, ErrorCode.INTERNAL,
                                                    f"lost on restart: {err}"))
                    continue
                self._jobs.add(record)
                logger.bind(job=e.spec.job_id).info("replayed from the journal ({} tokens "
                                                    "streamed before)", record.generated)

    # ---- runner ---------------------------------------------------------------------

    def _on_runner_up(self, msg: RunnerUp) -> None:
        hello = msg.hello
        self._runner = hello
        for job_id, generated in hello.jobs.items():
            record = self._jobs.live.get(job_id)
            if record is None:
                self._command(rp.Drop(job_id=job_id))
            else:
                # Equal counts: a Resume will do. Otherwise (it ran on while we were
                # down) a full Start follows, and the runner keeps what of its snapshot
                # matches the tokens we streamed.
                record.on_runner = record.generated == generated
        if hello.model_id:
            self._policy.on_model_loaded(hello.model_id)

    def _on_runner_down(self, msg: RunnerDown) -> None:
        self._runner = None
        self._snapshots = (0, 0)
        self._policy.loaded_model = None  # the next runner says what it has
        for record in self._jobs.live.values():
            record.on_runner = False
        job = self._policy.running
        if job is None:
            return
        record = self._jobs.live[job.job_id]
        outcome = self._policy.on_failed(job.job_id, 0.0, requeue=True)
        log = logger.bind(job=job.job_id)
        if outcome is ReportOutcome.REQUEUED:
            record.state = "paused"
            log.warning("runner lost ({}); resumes after its {} streamed tokens",
                        msg.reason, record.generated)
        elif outcome is ReportOutcome.CANCELLED:
            self._end(record, m.event_error(job.job_id, ErrorCode.CANCELLED,
                                            "cancelled by the client"))
        else:
            log.warning("runner lost ({}) during a chat; the client may retry", msg.reason)
            self._end(record, m.event_error(job.job_id, ErrorCode.RUNNER_FAILED,
                                            f"the runner failed ({msg.reason}); retry",
                                            retryable=True))

    def _on_stats(self, msg: RunnerStats) -> None:
        self._snapshots = (msg.count, msg.nbytes)

    def _on_report(self, msg: FromRunner) -> None:
        report = msg.report
        if isinstance(report, rp.ModelLoaded):
            self._policy.on_model_loaded(report.model_id)
            return
        if isinstance(report, rp.LoadFailed):
            logger.error("runner could not load {}: {}", report.model_id, report.message)
            return
        job_id = getattr(report, "job_id", None)
        running = self._policy.running
        if running is None or running.job_id != job_id:
            logger.bind(job=job_id).debug("stale {} report ignored", report.kind)
            return
        try:
            self._REPORTS[type(report)](self, self._jobs.live[job_id], report)
        except PolicyError:  # a report the policy's state does not allow: our bug, logged
            logger.bind(job=job_id).exception("{} report refused by the policy", report.kind)

    def _started(self, record: JobRecord, rep: rp.Started) -> None:
        self._policy.on_started(record.job_id)
        now = time.time()
        record.prompt_tokens = rep.prompt_tokens
        if record.started_at is None or record.seed != rep.seed:
            self._journal.started(record.job_id, rep.seed, now)
        record.seed = rep.seed
        record.started = True
        record.started_at = record.started_at or now
        record.state = "cancelling" if record.state == "cancelling" else "running"
        self._emit(record, m.event_started(record.job_id, record.spec.model_id,
                                           record.resumed, record.tier))

    def _token(self, record: JobRecord, rep: rp.Token) -> None:
        if rep.seq != record.generated:
            logger.bind(job=record.job_id).warning("token seq {} where {} was due; dropped",
                                                   rep.seq, record.generated)
            return
        self._policy.on_tokens(record.job_id, 1, rep.seconds)
        now = time.time()
        self._journal.token(record.job_id, rep.seq, rep.token_id, rep.text, now)
        record.token_ids.append(rep.token_id)
        record.texts.append(rep.text)
        record.first_token_at = record.first_token_at or now
        if record.spec.stream and record.state != "cancelling":
            self._emit(record, m.event_token(record.job_id, rep.seq, rep.text))

    def _paused(self, record: JobRecord, rep: rp.Paused) -> None:
        reason = "budget" if rep.grant_spent else (record.pause_reason or "preempted")
        outcome = self._policy.on_paused(record.job_id, rep.seconds, reason)
        if outcome in (ReportOutcome.REQUEUED, ReportOutcome.HELD):
            record.state = "paused"
            record.preemptions += 1
            self._journal.paused(record.job_id, record.preemptions)
            self._emit(record, m.event_paused(record.job_id, reason))
            logger.bind(job=record.job_id).info("paused ({}) after {} tokens", reason,
                                                record.generated)
            return
        self._command(rp.Drop(job_id=record.job_id))
        if outcome is ReportOutcome.CANCELLED:
            self._end(record, m.event_error(record.job_id, ErrorCode.CANCELLED,
                                            "cancelled by the client"))
        else:  # a chat stopped by something other than its own cancel
            self._end(record, m.event_error(
                record.job_id, ErrorCode.SHUTTING_DOWN if self._draining else ErrorCode.CANCELLED,
                f"the chat was interrupted ({reason}); retry", retryable=True))

    def _finished(self, record: JobRecord, rep: rp.Finished) -> None:
        self._policy.on_finished(record.job_id, rep.seconds)
        record.tail = rep.tail
        record.prompt_tokens = rep.prompt_tokens
        self._end(record, done_event(record, rep.finish_reason, time.time()))

    def _cancelled(self, record: JobRecord, rep: rp.Cancelled) -> None:
        self._policy.on_cancelled(record.job_id, rep.seconds)
        self._end(record, m.event_error(record.job_id, ErrorCode.CANCELLED,
                                        "cancelled by the client"))

    def _failed(self, record: JobRecord, rep: rp.Failed) -> None:
        self._policy.on_failed(record.job_id, rep.seconds)
        self._end(record, m.event_error(record.job_id, ErrorCode.RUNNER_FAILED,
                                        f"the runner cannot run this job: {rep.message}",
                                        retryable=False))

    def _unknown(self, record: JobRecord, rep: rp.Unknown) -> None:
        record.on_runner = False
        self._command(start_command(record, self._policy.running.grant))

    _REPORTS: dict[type, Any] = {
        rp.Started: _started, rp.Token: _token, rp.Paused: _paused, rp.Finished: _finished,
        rp.Cancelled: _cancelled, rp.Failed: _failed, rp.Unknown: _unknown,
    }

    # ---- decisions ------------------------------------------------------------------

    def _pump(self) -> None:
        """Ask the policy until it is idle; act on each decision; arm the timer."""
        if self._runner is None or self._draining:
            return
        for _ in range(8):  # a Run or Preempt changes state; a few rounds reach Idle
            decision = self._policy.decide()
            if isinstance(decision, Run):
                self._run(decision)
            elif isinstance(decision, Preempt):
                self._preempt(decision)
            if isinstance(decision, Idle) or self._runner is None:
                break
        self._arm(decision.wake_at)

    def _run(self, d: Run) -> None:
        record = self._jobs.live[d.job_id]
        record.tier, record.state, record.pause_reason = d.tier, "running", None
        record.resumed = d.resume or record.generated > 0
        logger.bind(job=d.job_id).info("dispatch: tier {}{}{}", d.tier,
                                       ", swap to " + d.model_id if d.swap else "",
                                       ", resume" if record.resumed else "")
        if d.swap:
            self._command(rp.Load(model_id=d.model_id))
        grant = d.token_grant or 0
        if record.on_runner:
            self._command(rp.Resume(job_id=d.job_id, generated=record.generated, grant=grant))
        else:
            record.on_runner = True
            self._command(start_command(record, grant))

    def _preempt(self, d: Preempt) -> None:
        record = self._jobs.live[d.running_job_id]
        record.state, record.pause_reason = "pausing", d.reason
        logger.bind(job=d.running_job_id).info("preempt ({}) for {}", d.reason, d.for_job_id)
        self._command(rp.Pause(job_id=d.running_job_id))

    def _arm(self, wake_at: float | None) -> None:
        if wake_at == self._wake_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake_at = wake_at
        if wake_at is not None:
            delay = max(0.0, wake_at - self._clock())
            self._timer = threading.Timer(delay, self._ring)
            self._timer.daemon = True
            self._timer.start()

    def _ring(self) -> None:
        """Timer thread: only tells; the actor thread owns every field."""
        try:
            self.actor_ref.tell(_Wake())
        except pykka.ActorDeadError:
            pass

    def _on_wake(self, msg: _Wake) -> None:
        self._wake_at = None
        self._timer = None

    # ---- stopping -------------------------------------------------------------------

    def _on_drain(self, msg: Drain) -> None:
        self._draining = True
        running = self._policy.running
        if running is not None and self._runner is not None:
            record = self._jobs.live[running.job_id]
            if record.state == "running":
                record.state, record.pause_reason = "pausing", "preempted"
                self._command(rp.Pause(job_id=running.job_id))

    def _on_quiet(self, msg: Quiet) -> bool:
        return self._policy.running is None or self._runner is None

    _HANDLERS: dict[type, Any] = {
        ClientRequest: ClientRequests._on_client, ClientGone: ClientRequests._on_client_gone,
        FromRunner: _on_report, RunnerUp: _on_runner_up, RunnerDown: _on_runner_down,
        RunnerStats: _on_stats, _Wake: _on_wake, Wire: _on_wire, Replay: _on_replay,
        Drain: _on_drain, Quiet: _on_quiet,
    }

    # ---- output ---------------------------------------------------------------------

    def _command(self, command: rp.Command) -> None:
        assert self._link is not None
        self._link.tell(ToRunner(command))

    def _reply(self, conn: bytes, msg: dict[str, Any]) -> None:
        assert self._front is not None
        self._front.tell(Outgoing(conn, msg))

    def _emit(self, record: JobRecord, msg: dict[str, Any]) -> None:
        for conn in record.subscribers:
            self._reply(conn, msg)

    def _end(self, record: JobRecord, final: dict[str, Any]) -> None:
        """Journal the end, then tell every subscriber (persist before telling)."""
        self._journal.finish(record.job_id, final, time.time())
        self._emit(record, final)
        self._jobs.end(record, final)
        logger.bind(job=record.job_id).info("ended: {}", final.get("finish_reason")
                                            or final.get("code"))
