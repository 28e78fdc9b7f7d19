"""A producer's jobs in the scheduler: persisted, submitted, followed, finished, re-attached.

Every producer process hands work to the scheduler the same way, so the rules live here
once (Titanic's rule from the ZeroMQ guide, on the client side):

1. **Persist before submitting.** A job is written to the results database (state
   ``pending``) with its id before it is sent, so a producer killed at any point finds
   it again on restart, and sends or attaches it under that same id. The id ends in a
   random tag (``ids.py``): an id another client could compute (``nataraj-7``) is one
   it could take first, after which the scheduler refuses the producer's own job.
2. **Submit; remember acknowledgement.** ``accepted`` moves it to ``submitted``. A
   refusal the scheduler calls retryable (``queue_full``, ``shutting_down``) or no
   scheduler at all leaves it ``pending`` for the next sweep; any other refusal is final
   (``failed``, with the error kept).
3. **Follow without tokens.** Producers submit with ``stream: false``; only ``started``,
   ``paused``, ``done`` and ``error`` arrive. ``done`` hands the event to the producer's
   callback (which stores the result) and then marks the job ``done``; storing is
   idempotent by job id, so a crash between the two repeats the store, not the job.
4. **Re-attach, never resubmit blindly.** After a restart or a lost connection, jobs
   that were ``submitted`` are ``attach``-ed (the scheduler's journal keeps them, and
   keeps the outcome of recently finished ones); only an ``attach`` answered
   ``not_found`` is submitted again, under the same id, which the scheduler treats as
   idempotent. ``pending`` jobs are submitted. So none is submitted twice for one run.

Not thread-safe (the protocol ``Client`` is not): one tracker per actor thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from loguru import logger

from uniun.actors.producers.results import ResultsStore
from uniun.protocol.client import Client, ClientError, JobStream, SchedulerUnavailable, Timeout

RETRYABLE_REFUSALS = ("queue_full", "shutting_down", "runner_failed")
DoneCallback = Callable[[dict[str, Any], dict[str, Any]], None]
ErrorCallback = Callable[[dict[str, Any], dict[str, Any]], None]


class JobTracker:
    """Submits and follows one producer's jobs. See the module docstring."""

    def __init__(self, producer: str, client: Client, store: ResultsStore, *,
                 on_done: DoneCallback, on_error: ErrorCallback | None = None) -> None:
        self.producer = producer
        self.client = client
        self.store = store
        self.on_done = on_done
        self.on_error = on_error
        self.streams: dict[str, JobStream] = {}
        self.scheduler_ok = True  # False while the scheduler cannot be reached

    # -- submitting -------------------------------------------------------------------

    def add(self, job: dict[str, Any], meta: dict[str, Any]) -> bool:
        """Persist a new job and submit it. False if its id was already known."""
        job = {**job, "stream": False}
        if not self.store.record_job(job["job_id"], self.producer, job, meta):
            return False
        self._submit(job)
        return True

    def in_flight(self) -> int:
        """Jobs persisted and not finished (pending or submitted)."""
        return len(self.store.open_jobs(self.producer))

    def sweep(self) -> None:
        """Re-attach or (re)submit every open job that this tracker is not following."""
        for row in self.store.open_jobs(self.producer):
            job_id = row["job_id"]
            if job_id in self.streams:
                continue
            if row["state"] == "submitted":
                self._attach(row)
            else:
                self._submit(row["job"])
            if not self.scheduler_ok:
                return

    def _submit(self, job: dict[str, Any]) -> None:
        job_id = job["job_id"]
        try:
            stream = self.client.submit(job)
        except ClientError as err:
            if err.code in RETRYABLE_REFUSALS or err.retryable:
                logger.bind(job=job_id).info("scheduler refused for now ({}); will retry",
                                             err.code)
                return
            logger.bind(job=job_id).warning("scheduler refused the job: {}", err)
            self._fail(job_id, {"type": "error", "job_id": job_id, "code": err.code,
                                "message": err.message, "retryable": False})
            return
        except (SchedulerUnavailable, Timeout) as err:
            self._lost(err)
            return
        self.scheduler_ok = True
        self.store.set_job_state(job_id, "submitted")
        self.streams[job_id] = stream

    def _attach(self, row: dict[str, Any]) -> None:
        job_id = row["job_id"]
        try:
            stream = self.client.attach(job_id)
        except ClientError as err:
            if err.code == "not_found":
                logger.bind(job=job_id).info("scheduler no longer knows the job; resubmitting")
                self._submit(row["job"])
            else:
                logger.bind(job=job_id).warning("attach refused: {}", err)
            return
        except (SchedulerUnavailable, Timeout) as err:
            self._lost(err)
            return
        self.scheduler_ok = True
        self.streams[job_id] = stream

    def _lost(self, err: Exception) -> None:
        if self.scheduler_ok:
            logger.warning("scheduler unavailable ({}); jobs stay persisted", err)
        self.scheduler_ok = False

    # -- following --------------------------------------------------------------------

    def pump(self, timeout: float) -> int:
        """Wait up to ``timeout`` for job events and handle them; returns jobs finished.

        Waiting on one stream pumps the client's socket for all of them (the client
        routes every event to its job's queue), so the others are drained without
        waiting.
        """
        if not self.streams:
            time.sleep(timeout)
            return 0
        finished = 0
        first = True
        for job_id, stream in list(self.streams.items()):
            try:
                while (event := stream.next_event(timeout if first else 0.0)) is not None:
                    first = False
                    if event["type"] in ("done", "error"):
                        self._finish(job_id, event)
                        finished += 1
                        break
                else:
                    self.streams.pop(job_id, None)  # ended without a terminal event
            except Timeout:
                pass
            except ClientError as err:  # attach failure surfaced through the stream
                self.streams.pop(job_id, None)
                if err.code == "not_found":
                    self.store.set_job_state(job_id, "pending")
            except SchedulerUnavailable as err:
                self._lost(err)
                self.streams.clear()  # re-attached by the next sweep
                return finished
            first = False
        return finished

    def _finish(self, job_id: str, event: dict[str, Any]) -> None:
        self.streams.pop(job_id, None)
        row = self.store.job(job_id)
        if row is None or row["state"] not in ("pending", "submitted"):
            return  # superseded or already handled
        if event["type"] == "done":
            try:
                self.on_done(row, event)
            except Exception:  # noqa: BLE001 - any failure to store fails the job, logged
                logger.bind(job=job_id).exception("storing the result failed")
                self.store.set_job_state(job_id, "failed", "storing the result failed")
                return
            self.store.set_job_state(job_id, "done")
            return
        if event.get("code") in RETRYABLE_REFUSALS and event.get("retryable"):
            logger.bind(job=job_id).info("job interrupted ({}); resubmitting", event["code"])
            self.store.set_job_state(job_id, "pending")
            return
        self._fail(job_id, event)

    def _fail(self, job_id: str, event: dict[str, Any]) -> None:
        state = "cancelled" if event.get("code") == "cancelled" else "failed"
        self.store.set_job_state(job_id, state, f"{event.get('code')}: {event.get('message')}")
        row = self.store.job(job_id)
        if self.on_error is not None and row is not None:
            self.on_error(row, event)

    def close(self) -> None:
        for stream in self.streams.values():
            stream.close()
        self.streams.clear()
