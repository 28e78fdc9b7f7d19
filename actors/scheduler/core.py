"""The scheduler core: every decision of the scheduler process, as a plain typed class.

Theory of operation (vLLM's glue loop without the I/O). One input goes in — a client
request, a runner report, the runner coming up or going down, the timer — and the core
updates the policy (pure, clock-injected) and its job table, and returns
:class:`~uniun.actors.scheduler.effects.Effects`: journal writes, messages for clients and
commands for the runner. After every input its host calls :meth:`SchedulerCore.pump`,
which asks ``policy.decide()`` until it says ``Idle`` and turns each ``Run`` / ``Preempt``
into runner commands, plus the time to be woken next. Nothing here blocks, reads a clock
it was not given, or touches a file or a socket, so the whole scheduler can be driven by
a unit test with a fake clock and a fake runner.

The rules it keeps:

- **Persist before telling.** Every message that tells a client something durable (an
  ``accepted``, a ``token``, a terminal event) comes with the journal write that records
  it, in the same :class:`Effects`, and the host applies journal writes first.
- **One terminal event per job.** :meth:`_end` is the only way a job ends; a job that has
  ended cannot end again. A cancel the core has acknowledged (``cancelled``) ends the job
  with ``error cancelled`` even if the runner finished it first.
- **Runner failure.** When the runner goes down, its running job is failed over: a chat
  ends with a retryable ``runner_failed`` (never silently re-run); any other job goes back
  to the front of its tier and continues on the next runner after the tokens it already
  streamed (from a spilled snapshot or by recompute).
- **Poison.** A job that was running at ``POISON_AFTER_DEATHS`` (3) runner deaths in a
  row, with no token streamed in between, is what kills the runner: it is dead-lettered
  with the non-retryable ``poisoned`` error instead of being resumed on the next runner,
  so one bad job cannot crash-loop the runner until the supervisor gives up.
- **Refusals change nothing.** A request handler validates, then changes state, then
  replies; a :class:`ProtocolError` raised before the change is the reply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from loguru import logger

from uniun.actors.policy.decision import Idle, Preempt, ReportOutcome, Run
from uniun.actors.policy.job import PolicyError
from uniun.actors.scheduler.admission import chat_client
from uniun.actors.scheduler.core_power import PowerInputs
from uniun.actors.scheduler.core_requests import ClientRequests
from uniun.actors.scheduler.core_state import cancelled_event
from uniun.actors.scheduler.effects import Effects, JPaused, JStarted, JToken
from uniun.actors.scheduler.jobs import JobRecord, done_event, start_command
from uniun.actors.scheduler.journal import JournalEntry
from uniun.actors.scheduler.kept_logprobs import pack
from uniun.protocol import messages as m, runner_records as rp
from uniun.protocol.errors import ErrorCode

__all__ = ["SchedulerCore", "MAX_DECISIONS_PER_PUMP"]

MAX_DECISIONS_PER_PUMP = 8  # a Run or Preempt changes state; a few rounds reach Idle
POISON_AFTER_DEATHS = 3  # runner deaths in a row while one job ran (no token between)


class SchedulerCore(ClientRequests, PowerInputs):
    """See the module docstring; the client requests are in ``core_requests.py``, the
    state and the end of a job in ``core_state.py``."""

    # ---- start-up -------------------------------------------------------------------

    def replay(self, entries: Iterable[JournalEntry]) -> Effects:
        """Rebuild the job table and the policy's queue from the journal."""
        self.changes += 1
        fx = Effects()
        now, wall = self._clock(), self._wall()
        for e in entries:
            record = JobRecord(spec=e.spec, accepted_at=e.accepted_at, seed=e.seed,
                               started=e.started, started_at=e.started_at,
                               first_token_at=e.first_token_at, preemptions=e.preemptions,
                               token_ids=e.token_ids, texts=e.texts, owner=e.owner,
                               # the journal keeps texts, not log-probabilities
                               logprobs_dropped=e.spec.logprobs is not None and bool(e.texts))
            if e.final is not None:
                self.jobs.end(record, e.final)
                continue
            if e.cancel_asked:  # the client was told "cancelled": that is how it ends
                self._end(fx, record, cancelled_event(e.spec.job_id))
                continue
            if e.spec.kind == self.policy.config.chat_kind and e.started:
                self._end(fx, record, m.event_error(
                    e.spec.job_id, ErrorCode.RUNNER_FAILED,
                    "the scheduler restarted during this chat; retry", retryable=True))
                continue
            try:
                record.tier = self.policy.submit(e.spec, arrival=now - (wall - e.accepted_at),
                                                 client=chat_client(e.owner, None, e.spec.client))
            except Exception as err:  # noqa: BLE001 - one bad row must not crash-loop the scheduler
                logger.bind(job=e.spec.job_id).exception("cannot replay this job")
                self._end(fx, record, m.event_error(e.spec.job_id, ErrorCode.INTERNAL,
                                                    f"lost on restart: {err}"))
                continue
            self.jobs.add(record)
            self.rec.replayed(record)
            logger.bind(job=e.spec.job_id).info("replayed from the journal ({} tokens "
                                                "streamed before)", record.generated)
        self.rec.mark(fx, "scheduler_start", None, f"{len(self.jobs)} live jobs replayed")
        return fx

    # ---- the runner -----------------------------------------------------------------

    def runner_up(self, hello: rp.Hello) -> Effects:
        """A runner said Hello: nothing runs on it; it holds records of ``hello.jobs``."""
        self.changes += 1
        fx = Effects()
        self.runner = hello
        for job_id, generated in hello.jobs.items():
            record = self.jobs.live.get(job_id)
            if record is None:
                fx.commands.append(rp.Drop(job_id=job_id))
            else:
                # Equal counts: a Resume will do. Otherwise (it ran on while we were
                # down) a full Start follows, and the runner keeps what of its snapshot
                # matches the tokens we streamed; either way it holds the job.
                record.on_runner = True
                record.in_sync = record.generated == generated
        if hello.model_id:
            self.policy.on_model_loaded(hello.model_id)
        self.rec.runner_up(fx, hello.pid, hello.model_id)
        return fx

    def runner_down(self, reason: str) -> Effects:
        """The runner we worked with is gone: fail over the job that ran on it."""
        self.changes += 1
        fx = Effects()
        self.runner = None
        self.snapshots = (0, 0)
        self.policy.loaded_model = None  # the next runner says what it has
        for held in self.jobs.live.values():
            held.on_runner = held.in_sync = False
        job = self.policy.running
        record = self.jobs.live[job.job_id] if job is not None else None
        self.rec.runner_lost(fx, record, reason)
        if job is None or record is None:
            return fx
        record.deaths += 1
        poisoned = record.deaths >= POISON_AFTER_DEATHS and record.state != "cancelling"
        outcome = self.policy.on_failed(job.job_id, 0.0, requeue=not poisoned)
        log = logger.bind(job=job.job_id)
        if poisoned and outcome is ReportOutcome.FAILED:
            log.warning("poisoned: the runner died {} times in a row running this job; "
                      "dead-lettered", record.deaths)
            self._end(fx, record, m.event_error(
                job.job_id, ErrorCode.POISONED,
                f"the runner died {record.deaths} times in a row while running this job "
                f"(last: {reason}); it is not run again", retryable=False))
        elif outcome is ReportOutcome.REQUEUED:
            record.state = "paused"
            self.rec.requeued(record)
            log.warning("runner lost ({}); resumes after its {} streamed tokens",
                        reason, record.generated)
        elif outcome is ReportOutcome.CANCELLED:
            self._end(fx, record, cancelled_event(job.job_id))
        else:
            log.warning("runner lost ({}) during a chat; the client may retry", reason)
            self._end(fx, record, m.event_error(job.job_id, ErrorCode.RUNNER_FAILED,
                                                f"the runner failed ({reason}); retry",
                                                retryable=True))
        return fx

    def runner_stats(self, count: int, nbytes: int, trimmed: int = 0,
                     spilled: int = 0) -> Effects:
        if (count, nbytes) != self.snapshots or (trimmed, spilled) != self.rec.parking:
            self.changes += 1  # status shows both
        self.snapshots = (count, nbytes)
        fx = Effects()
        self.rec.runner_stats(fx, count, nbytes, trimmed, spilled)
        return fx

    def report(self, report: rp.Report) -> Effects:
        """A report of the current runner."""
        self.changes += 1
        fx = Effects()
        if isinstance(report, rp.ModelLoaded):
            self.policy.on_model_loaded(report.model_id)
            return fx
        if isinstance(report, rp.LoadFailed):
            logger.error("runner could not load {}: {}", report.model_id, report.message)
            return fx
        job_id = getattr(report, "job_id", None)
        running = self.policy.running
        if running is None or running.job_id != job_id:
            logger.bind(job=job_id).debug("stale {} report ignored", report.kind)
            return fx
        try:
            self._REPORTS[type(report)](self, fx, self.jobs.live[job_id], report)
        except PolicyError:  # a report the policy's state does not allow: our bug, logged
            logger.bind(job=job_id).exception("{} report refused by the policy", report.kind)
        return fx

    def _started(self, fx: Effects, record: JobRecord, rep: rp.Started) -> None:
        self.policy.on_started(record.job_id, rep.prompt_tokens)
        now = self._wall()
        record.prompt_tokens = rep.prompt_tokens
        if record.started_at is None or record.seed != rep.seed:
            fx.journal.append(JStarted(record.job_id, rep.seed, now))
        record.seed = rep.seed
        record.started = True
        record.started_at = record.started_at or now
        if record.state != "cancelling":
            record.state = "running"
        self._emit(fx, record, m.event_started(record.job_id, record.spec.model_id,
                                               record.resumed, record.tier))

    def _token(self, fx: Effects, record: JobRecord, rep: rp.Token) -> None:
        if rep.seq != record.generated:
            logger.bind(job=record.job_id).warning("token seq {} where {} was due; dropped",
                                                   rep.seq, record.generated)
            return
        self.policy.on_tokens(record.job_id, 1, rep.seconds)
        now = self._wall()
        fx.journal.append(JToken(record.job_id, rep.seq, rep.token_id, rep.text, now))
        record.deaths = 0  # progress: the deaths before were not this job's doing
        record.token_ids.append(rep.token_id)
        record.texts.append(rep.text)
        logprobs = None
        if record.spec.logprobs is not None:  # indexed by seq (None: not kept, e.g. a
            # token journaled before a scheduler restart)
            logprobs = m.expand_logprobs(rep.logprobs)
            record.logprobs.extend([None] * (rep.seq - len(record.logprobs)))
            record.logprobs.append(None if logprobs is None else pack(rep.logprobs))
        first_of_job = record.first_token_at is None
        record.first_token_at = record.first_token_at or now
        self.rec.token(fx, record, rep.seconds, first_of_job)
        if record.spec.stream and record.state != "cancelling":
            self._emit(fx, record, m.event_token(record.job_id, rep.seq, rep.text, logprobs))

    def _paused(self, fx: Effects, record: JobRecord, rep: rp.Paused) -> None:
        reason = "budget" if rep.grant_spent else (record.pause_reason or "preempted")
        outcome = self.policy.on_paused(record.job_id, rep.seconds, reason)
        if outcome in (ReportOutcome.REQUEUED, ReportOutcome.HELD):
            record.state = "paused"
            record.preemptions += 1
            fx.journal.append(JPaused(record.job_id, record.preemptions))
            self.rec.paused(fx, record, "shutdown" if self.draining else reason)
            self._emit(fx, record, m.event_paused(record.job_id, reason))
            logger.bind(job=record.job_id).info("paused ({}) after {} tokens", reason,
                                                record.generated)
            return
        fx.commands.append(rp.Drop(job_id=record.job_id))
        if outcome is ReportOutcome.CANCELLED:
            self._end(fx, record, cancelled_event(record.job_id))
        else:  # a chat stopped by something other than its own cancel
            code = ErrorCode.SHUTTING_DOWN if self.draining else ErrorCode.CANCELLED
            self._end(fx, record, m.event_error(
                record.job_id, code, f"the chat was interrupted ({reason}); retry",
                retryable=True))

    def _finished(self, fx: Effects, record: JobRecord, rep: rp.Finished) -> None:
        self.policy.on_finished(record.job_id, rep.seconds)
        record.tail = rep.tail
        record.prompt_tokens = rep.prompt_tokens
        if record.state == "cancelling":  # the cancel was acknowledged: it wins the race
            self._end(fx, record, cancelled_event(record.job_id))
        else:
            self._end(fx, record, done_event(record, rep.finish_reason, self._wall()))

    def _cancelled(self, fx: Effects, record: JobRecord, rep: rp.Cancelled) -> None:
        self.policy.on_cancelled(record.job_id, rep.seconds)
        self._end(fx, record, cancelled_event(record.job_id))

    def _failed(self, fx: Effects, record: JobRecord, rep: rp.Failed) -> None:
        self.policy.on_failed(record.job_id, rep.seconds)
        self._end(fx, record, m.event_error(record.job_id, ErrorCode.RUNNER_FAILED,
                                            f"the runner cannot run this job: {rep.message}",
                                            retryable=False))

    def _unknown(self, fx: Effects, record: JobRecord, rep: rp.Unknown) -> None:
        running = self.policy.running
        record.on_runner = record.in_sync = True  # the Start gives it the job's record again
        fx.commands.append(start_command(record, running.grant if running else None))

    _REPORTS: ClassVar[dict[type, Callable[..., None]]] = {
        rp.Started: _started, rp.Token: _token, rp.Paused: _paused, rp.Finished: _finished,
        rp.Cancelled: _cancelled, rp.Failed: _failed, rp.Unknown: _unknown,
    }

    # ---- decisions ------------------------------------------------------------------

    def pump(self) -> Effects:
        """Ask the policy until it is idle; turn each decision into commands; say when to
        wake (after every input; a no-op without a runner or while draining)."""
        fx = Effects()
        if self.runner is None or self.draining:
            if self.watchers.due is not None:
                fx.wake_at = self.watchers.due
            return fx
        decision: Any = Idle()
        for _ in range(MAX_DECISIONS_PER_PUMP):
            decision = self.policy.decide()
            if isinstance(decision, Run):
                self.changes += 1
                self._run(fx, decision)
            elif isinstance(decision, Preempt):
                self.changes += 1
                self._preempt(fx, decision)
            if isinstance(decision, Idle):
                break
        self.power_marks(fx)
        fx.wake_at = _earliest(_earliest(decision.wake_at, self.rec.depths(fx, self.policy)),
                               self.watchers.due)
        return fx

    def _run(self, fx: Effects, d: Run) -> None:
        record = self.jobs.live[d.job_id]
        record.tier, record.state, record.pause_reason = d.tier, "running", None
        record.resumed = d.resume or record.generated > 0
        logger.bind(job=d.job_id).info("dispatch: tier {}{}{}", d.tier,
                                       ", swap to " + d.model_id if d.swap else "",
                                       ", resume" if record.resumed else "")
        self.rec.dispatched(fx, record, d)
        if d.swap:
            fx.commands.append(rp.Load(model_id=d.model_id))
        grant = d.token_grant or 0
        if record.in_sync:
            fx.commands.append(rp.Resume(job_id=d.job_id, generated=record.generated,
                                         grant=grant))
        else:
            record.on_runner = record.in_sync = True
            fx.commands.append(start_command(record, grant))

    def _preempt(self, fx: Effects, d: Preempt) -> None:
        record = self.jobs.live[d.running_job_id]
        record.state, record.pause_reason = "pausing", d.reason
        logger.bind(job=d.running_job_id).info("preempt ({}) for {}", d.reason, d.for_job_id)
        self.rec.preempting(fx, d)
        fx.commands.append(rp.Pause(job_id=d.running_job_id))

    # ---- stopping -------------------------------------------------------------------

    def drain(self) -> Effects:
        """The scheduler is stopping: park the running job so its progress is exact."""
        self.changes += 1
        fx = Effects()
        self.draining = True
        running = self.policy.running
        if running is not None and self.runner is not None:
            record = self.jobs.live[running.job_id]
            if record.state == "running":
                record.state, record.pause_reason = "pausing", "preempted"
                fx.commands.append(rp.Pause(job_id=running.job_id))
        return fx


def _earliest(a: float | None, b: float | None) -> float | None:
    """The earlier of two wake times (None: no wake)."""
    return b if a is None else a if b is None else min(a, b)
