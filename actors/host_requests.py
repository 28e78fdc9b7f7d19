"""The client-request half of the policy host (a mixin of :class:`PolicyHost`).

Split out only to keep each file readable; it is the same actor. Each handler validates,
changes state, replies — in that order, so a refused request changes nothing. It uses the
host's state (``_policy``, ``_jobs``, ``_journal``, ``_queue_cap``, ``_runner``,
``_snapshots``, ``_processes``) and its output methods (``_reply``, ``_command``,
``_end``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from loguru import logger

from uniun.actors.front import ClientGone, ClientRequest
from uniun.actors.jobs import JobRecord
from uniun.actors.policy.decision import CancelOutcome
from uniun.protocol import messages as m
from uniun.protocol.errors import ErrorCode, ProtocolError
from uniun.runtime import runner_protocol as rp

__all__ = ["ClientRequests"]


class ClientRequests:
    """Handlers of the requests the front forwards (everything but ``ping``)."""

    _policy: Any
    _jobs: Any
    _journal: Any
    _queue_cap: int
    _runner: rp.Hello | None
    _snapshots: tuple[int, int]
    _processes: Any
    _reply: Any  # (conn, msg) -> None
    _command: Any  # (rp.Command) -> None
    _end: Any  # (JobRecord, final event) -> None

    def _on_client(self, msg: ClientRequest) -> None:
        handler = self._REQUESTS.get(type(msg.request))
        if handler is None:
            self._reply(msg.conn, m.reply_error(getattr(msg.request, "id", None), ProtocolError(
                ErrorCode.UNKNOWN_TYPE, "this server does not serve that request")))
            return
        try:
            handler(self, msg.conn, msg.request)
        except ProtocolError as err:
            self._reply(msg.conn, m.reply_error(msg.request.id, err))
        except Exception as err:  # our bug: answer it, keep serving
            logger.exception("request {} failed", type(msg.request).__name__)
            self._reply(msg.conn, m.reply_error(msg.request.id, ProtocolError(
                ErrorCode.INTERNAL, f"internal error: {type(err).__name__}")))

    def _on_client_gone(self, msg: ClientGone) -> None:
        self._jobs.drop_subscriber(msg.conn)

    def _submit(self, conn: bytes, req: m.Submit) -> None:
        spec = req.job
        known = self._jobs.get(spec.job_id)
        if known is not None:
            if known.spec != spec:
                raise ProtocolError(ErrorCode.INVALID_FIELD, "job_id: a different job with "
                                    "this id was already accepted", field="job_id",
                                    job_id=spec.job_id)
            self._subscribe(conn, req.id, known, after_seq=None)
            return
        if len(self._jobs) >= self._queue_cap:
            raise ProtocolError(ErrorCode.QUEUE_FULL, f"{len(self._jobs)} jobs are waiting "
                                f"(the cap is {self._queue_cap}); retry later", job_id=spec.job_id)
        tier = self._policy.submit(spec)  # validates; raises InvalidField, changes nothing
        now = time.time()
        try:
            self._journal.accept(spec, now)
        except Exception:
            self._policy.cancel(spec.job_id)
            raise
        record = JobRecord(spec=spec, accepted_at=now, subscribers={conn}, tier=tier)
        self._jobs.add(record)
        logger.bind(job=spec.job_id).info("accepted: {} on {}, tier {}, {} tokens max",
                                          spec.kind, spec.model_id, tier, spec.max_new_tokens)
        self._reply(conn, m.reply_accepted(req.id, spec.job_id, tier))

    def _attach(self, conn: bytes, req: m.Attach) -> None:
        record = self._jobs.get(req.job_id)
        if record is None:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"no job {req.job_id!r}", job_id=req.job_id)
        self._subscribe(conn, req.id, record, after_seq=req.after_seq)

    def _subscribe(self, conn: bytes, msg_id: str, record: JobRecord, *,
                   after_seq: int | None) -> None:
        """Acknowledge (again) and replay what the client may have missed."""
        self._reply(conn, m.reply_accepted(msg_id, record.job_id, record.tier,
                                           state=record.state, streamed=record.generated))
        if after_seq is not None and record.spec.stream:
            for seq in range(after_seq + 1, record.generated):
                self._reply(conn, m.event_token(record.job_id, seq, record.texts[seq]))
        if record.final is not None:
            self._reply(conn, record.final)
        else:
            record.subscribers.add(conn)

    def _cancel(self, conn: bytes, req: m.Cancel) -> None:
        record = self._jobs.get(req.job_id)
        outcome = self._policy.cancel(req.job_id)
        if outcome is CancelOutcome.NOT_FOUND or record is None:
            if record is not None and record.final is not None \
                    and record.final.get("code") == ErrorCode.CANCELLED.value:
                self._reply(conn, m.reply_cancelled(req.id, req.job_id))  # idempotent
                return
            what = "has already ended" if record is not None else "is not known"
            raise ProtocolError(ErrorCode.NOT_FOUND, f"job {req.job_id!r} {what}",
                                job_id=req.job_id)
        log = logger.bind(job=req.job_id)
        if outcome is CancelOutcome.REMOVED:
            if record.on_runner:
                self._command(rp.Drop(job_id=req.job_id))
            self._end(record, m.event_error(req.job_id, ErrorCode.CANCELLED,
                                            "cancelled by the client"))
            log.info("cancelled while waiting")
        else:
            record.state = "cancelling"
            self._command(rp.Cancel(job_id=req.job_id))
            log.info("cancelling while running")
        self._reply(conn, m.reply_cancelled(req.id, req.job_id))

    def _foreground(self, conn: bytes, req: m.Foreground) -> None:
        self._policy.set_foreground(req.kind)
        self._reply(conn, m.reply_ok(req.id))

    def _lifecycle(self, conn: bytes, req: m.Lifecycle) -> None:
        self._policy.set_lifecycle(req.state)
        self._reply(conn, m.reply_ok(req.id))

    def _status(self, conn: bytes, req: m.StatusRequest) -> None:
        body = dict(self._policy.status())
        running = self._policy.running
        processes = dict(self._processes())
        processes["scheduler"] = os.getpid()
        if self._runner is not None:
            processes["runner"] = self._runner.pid
        body.update(
            loaded_model=self._policy.loaded_model,
            running=running.summary() if running is not None else None,
            snapshots={"count": self._snapshots[0], "bytes": self._snapshots[1]},
            processes=processes,
            runner={"up": self._runner is not None,
                    "pid": self._runner.pid if self._runner else None},
            jobs=len(self._jobs), queue_cap=self._queue_cap)
        self._reply(conn, m.reply_status(req.id, body))

    _REQUESTS: dict[type, Any] = {
        m.Submit: _submit, m.Attach: _attach, m.Cancel: _cancel, m.Foreground: _foreground,
        m.Lifecycle: _lifecycle, m.StatusRequest: _status,
    }
