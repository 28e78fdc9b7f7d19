"""The client-request half of the scheduler core: submit, attach, cancel, and the rest.

Each handler validates, then changes state, then replies, so a refused request changes
nothing: a :class:`ProtocolError` raised before the change is the reply. Idempotency is
by ``job_id``: the same submit is acknowledged again (and its missed events re-sent), a
different job under a known id is ``invalid_field job_id``. A new job must fit the
queue's bounds (``admission.py``: the cap, the chats' reserve, the client's share).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from loguru import logger

from uniun.actors.policy.decision import CancelOutcome
from uniun.actors.policy.tiers import T1
from uniun.actors.scheduler.admission import chat_client, holder_of
from uniun.actors.scheduler.core_state import CoreState, cancelled_event
from uniun.actors.scheduler.effects import Effects, JAccept, JCancelAsked, Send
from uniun.actors.scheduler.jobs import JobRecord
from uniun.actors.scheduler.kept_logprobs import unpack
from uniun.actors.scheduler.status import redacted, status_body
from uniun.protocol import messages as m, requests as rq, runner_records as rp
from uniun.protocol.errors import ErrorCode, ProtocolError

__all__ = ["ClientRequests", "STATUS_REUSE_S", "PROCESSES_REUSE_S"]

# A flood of status requests must cost the scheduler one snapshot per interval, not one
# each: a status body is reused while nothing changed and it is younger than this, s.
STATUS_REUSE_S = 0.2
# The processes' pids, CPU and RSS (read from files and /proc) are reused this long, s.
PROCESSES_REUSE_S = 0.5


class ClientRequests(CoreState):
    """The requests the front forwards (everything but ``ping``)."""

    def request(self, conn: bytes, request: rq.Request, owner: str | None = None) -> Effects:
        """One valid request from the front (everything but ``ping``). ``owner``: the
        client's CURVE key; a job belongs to the key that submitted it."""
        fx = Effects()
        if not isinstance(request, (rq.StatusRequest, rq.Watch)):
            self.changes += 1
        handler = self._REQUESTS.get(type(request))
        try:
            if handler is None:
                raise ProtocolError(ErrorCode.UNKNOWN_TYPE,
                                    "this server does not serve that request")
            handler(self, fx, conn, request, owner)
        except ProtocolError as err:
            fx.sends.append(Send(conn, m.reply_error(request.id, err)))
        except Exception as err:  # our bug: answer it, keep serving
            logger.exception("request {} failed", type(request).__name__)
            fx = Effects(sends=[Send(conn, m.reply_error(request.id, ProtocolError(
                ErrorCode.INTERNAL, f"internal error: {type(err).__name__}")))])
        return fx

    def accept_failed(self, job_id: str, conn: bytes, msg_id: str, error: str) -> Effects:
        """The journal could not record an accepted job: forget it and say so."""
        self.changes += 1
        record = self.jobs.live.get(job_id)
        if record is not None:
            self.policy.cancel(job_id)
            self.jobs.forget(record)
            self.rec.forget(job_id)
        logger.bind(job=job_id).error("journal write failed, job refused: {}", error)
        return Effects(sends=[Send(conn, m.reply_error(msg_id, ProtocolError(
            ErrorCode.INTERNAL, "the job could not be recorded; retry later",
            job_id=job_id)))])

    def client_gone(self, conn: bytes) -> Effects:
        self.jobs.drop_subscriber(conn)  # subscribers are not in status: no change
        self.watchers.drop(conn)
        return Effects()

    def _submit(self, fx: Effects, conn: bytes, req: rq.Submit, owner: str | None) -> None:
        spec = req.job
        known = self.jobs.get(spec.job_id)
        if known is not None:
            if known.spec != spec or known.owner != owner:
                raise ProtocolError(ErrorCode.INVALID_FIELD, "job_id: a different job with "
                                    "this id was already accepted", field="job_id",
                                    job_id=spec.job_id)
            # A re-sent submit from a connection that does not follow the job yet (a
            # client whose reply was lost with a killed scheduler) has seen none of its
            # tokens here: replay them, or its stream would start in the middle. A
            # connection already subscribed has them, or has them coming.
            fresh = known.final is None and conn not in known.subscribers
            self._subscribe(fx, conn, req.id, known, after_seq=-1 if fresh else None)
            return
        self._admit(spec.job_id, spec.kind, holder_of(owner, conn))
        # validates; raises InvalidField, changes nothing
        tier = self.policy.submit(spec, client=chat_client(owner, conn, spec.client))
        now = self._wall()
        record = JobRecord(spec=spec, accepted_at=now, subscribers={conn}, tier=tier,
                           owner=owner, conn=conn)
        self.jobs.add(record)
        fx.journal.append(JAccept(spec, now, owner))
        self.rec.accepted(fx, record)
        fx.sends.append(Send(conn, m.reply_accepted(req.id, spec.job_id, tier)))
        # Background submits come in bursts of thousands, and a log line costs about as
        # much as the rest of an accept: at INFO they doubled a chat's wait behind 10,000
        # submits (docs/device.md). Their "dispatch" and "ended" lines stay at INFO.
        logger.bind(job=spec.job_id).log(
            "INFO" if tier <= T1 else "DEBUG",
            "accepted: {} on {}, tier {}, {} tokens max", spec.kind, spec.model_id, tier,
            spec.max_new_tokens)

    def _admit(self, job_id: str, kind: str, holder: bytes | str | None) -> None:
        """Raise ``queue_full`` naming the bound a new job of ``kind`` would break."""
        jobs = self.jobs
        why = self.bounds.refusal(chat=kind == self.policy.config.chat_kind, live=len(jobs),
                                  background=jobs.occupancy.background,
                                  held=jobs.occupancy.held(holder))
        if why is not None:  # not logged: a burst is refused thousands of times
            raise ProtocolError(ErrorCode.QUEUE_FULL, why, job_id=job_id)

    def _attach(self, fx: Effects, conn: bytes, req: rq.Attach, owner: str | None) -> None:
        record = self._owned(req.job_id, owner)
        if record is None:
            raise self._not_found(req.job_id, owner)
        self._subscribe(fx, conn, req.id, record, after_seq=req.after_seq)

    def _not_found(self, job_id: str, owner: str | None) -> ProtocolError:
        """``not_found`` for a job we do not hold; for one the journal replay moved to
        the dead letters, the message says why it will not run (the code is attach's v1
        answer, so every client already handles it; docs/protocol.md)."""
        dead = self.dead_letters.get(job_id, owner)
        if dead is None:
            return ProtocolError(ErrorCode.NOT_FOUND, f"no job {job_id!r}", job_id=job_id)
        logger.bind(job=job_id).info("attach of a dead letter: {}", dead.reason)
        return ProtocolError(ErrorCode.NOT_FOUND, f"job {job_id!r} was accepted but moved to "
                             f"the dead letters at a restart: {dead.reason}", job_id=job_id)

    def _subscribe(self, fx: Effects, conn: bytes, msg_id: str, record: JobRecord, *,
                   after_seq: int | None) -> None:
        """Acknowledge (again) and replay what the client may have missed; the reply says
        when tokens come without the log-probabilities the job asked for."""
        dropped = record.logprobs_dropped and record.spec.logprobs is not None
        fx.sends.append(Send(conn, m.reply_accepted(
            msg_id, record.job_id, record.tier, state=record.state, streamed=record.generated,
            **({"logprobs_dropped": True} if dropped else {}))))
        if after_seq is not None and record.spec.stream:
            fx.sends.extend(Send(conn, m.event_token(record.job_id, seq, record.texts[seq],
                                                     _kept_logprobs(record, seq)))
                            for seq in range(after_seq + 1, record.generated))
        if record.final is not None:
            fx.sends.append(Send(conn, record.final))
        else:
            record.subscribers.add(conn)

    def _owned(self, job_id: str, owner: str | None) -> JobRecord | None:
        """The job, if ``owner`` may see it: another key's job is as good as unknown."""
        record = self.jobs.get(job_id)
        return record if record is not None and record.owner == owner else None

    def _cancel(self, fx: Effects, conn: bytes, req: rq.Cancel, owner: str | None) -> None:
        record = self._owned(req.job_id, owner)
        if record is None or record.final is not None:
            if record is not None and (record.final or {}).get("code") == \
                    ErrorCode.CANCELLED.value:
                fx.sends.append(Send(conn, m.reply_cancelled(req.id, req.job_id)))  # idempotent
                return
            what = "has already ended" if record is not None else "is not known"
            raise ProtocolError(ErrorCode.NOT_FOUND, f"job {req.job_id!r} {what}",
                                job_id=req.job_id)
        outcome = self.policy.cancel(req.job_id)
        log = logger.bind(job=req.job_id)
        if outcome is CancelOutcome.REMOVED:
            if record.on_runner:
                fx.commands.append(rp.Drop(job_id=req.job_id))
            self._end(fx, record, cancelled_event(req.job_id))
            log.info("cancelled while waiting")
        elif outcome is CancelOutcome.STOP_RUNNING:
            if record.state != "cancelling":
                record.state = "cancelling"
                fx.journal.append(JCancelAsked(req.job_id))  # before the reply: see JCancelAsked
                fx.commands.append(rp.Cancel(job_id=req.job_id))
            log.info("cancelling while running")
        else:  # live in our table but not in the policy's: a bug, said as not_found
            raise ProtocolError(ErrorCode.NOT_FOUND, f"job {req.job_id!r} is not known",
                                job_id=req.job_id)
        fx.sends.append(Send(conn, m.reply_cancelled(req.id, req.job_id)))

    def _foreground(self, fx: Effects, conn: bytes, req: rq.Foreground, _owner: object) -> None:
        self.policy.set_foreground(req.kind)
        fx.sends.append(Send(conn, m.reply_ok(req.id)))

    def _lifecycle(self, fx: Effects, conn: bytes, req: rq.Lifecycle, _owner: object) -> None:
        if req.state is not None:
            self.policy.set_lifecycle(req.state)
        if req.power is not None:  # an app's device facts (docs/device.md)
            pushed = self.power_from_app(req.power)  # type: ignore[attr-defined]
            fx.journal.extend(pushed.journal)
        fx.sends.append(Send(conn, m.reply_ok(req.id)))

    def _status(self, fx: Effects, conn: bytes, req: rq.StatusRequest,
                owner: str | None) -> None:
        fx.sends.append(Send(conn, m.reply_status(req.id, self._status_for(owner))))

    def _watch(self, fx: Effects, conn: bytes, req: rq.Watch, owner: str | None) -> None:
        self.watchers.add(conn, owner)  # the first status push follows this reply
        fx.sends.append(Send(conn, m.reply_ok(req.id)))

    def watch_sends(self, writes: Iterable[object]) -> list[Send]:
        """What to push to watchers for one applied input (``watchers.py``)."""
        return self.watchers.sends(writes, self.changes, self._status_for, self._owner_of,
                                   hold=self._chat_awaits_first_token())

    def _chat_awaits_first_token(self) -> bool:
        """A chat is queued, or runs without its first token yet: the moment its time to
        first token is made, which watchers' pushes (and what they make a page draw on
        the same cores) should not share."""
        running = self.policy.running
        if running is not None and running.spec.kind == self.policy.config.chat_kind:
            record = self.jobs.get(running.spec.job_id)
            return record is not None and record.first_token_at is None
        return self.policy.live_chats() > 0

    def _owner_of(self, job_id: str) -> str | None:
        record = self.jobs.get(job_id)
        return record.owner if record is not None else None

    def _status_for(self, owner: str | None) -> dict[str, Any]:
        body = self._status_snapshot()
        if owner is not None:  # a keyed client sees other keys' jobs without their ids
            body = redacted(body, lambda job_id: self._owned(job_id, owner) is not None
                        or self.dead_letters.get(job_id, owner) is not None)
        return body

    def _status_snapshot(self) -> dict[str, Any]:
        """The status body, rebuilt only when something changed or it is old (every reply
        shares it; nobody mutates it)."""
        now = self._clock()
        cached = self._status_cache
        if cached is not None and cached[1] == self.changes and now - cached[0] < STATUS_REUSE_S:
            return cached[2]
        procs = self._procs_cache
        if procs is None or now - procs[0] >= PROCESSES_REUSE_S:
            procs = self._procs_cache = (now, self._processes(), self._process_info())
        body = status_body(self.policy, self.jobs, self.runner, self.snapshots, procs[1],
                           queue_cap=self.queue_cap, quarantined=self.quarantined,
                           dead_letters=self.dead_letters.status())
        body.update(self.rec.status_extra(), process_info=procs[2],
                    t2_share_max=self.policy.config.t2_share_max,
                    power=self.power_status())  # type: ignore[attr-defined]
        self._status_cache = (now, self.changes, body)
        return body

    _REQUESTS: ClassVar[dict[type, Callable[..., None]]] = {
        rq.Submit: _submit, rq.Attach: _attach, rq.Cancel: _cancel,
        rq.Foreground: _foreground, rq.Lifecycle: _lifecycle, rq.StatusRequest: _status,
        rq.Watch: _watch,
    }


def _kept_logprobs(record: JobRecord, seq: int) -> dict[str, Any] | None:
    """A replayed token's log-probabilities, when the job asked and they are kept (not
    across a scheduler restart: the journal keeps texts, not these; not for an ended job
    past the bound of ``kept_logprobs.py``)."""
    return unpack(record.logprobs[seq]) if seq < len(record.logprobs) else None
