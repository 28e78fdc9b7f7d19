"""Fakes for unit tests of the producers' logic (no scheduler process, no socket).

``FakeClient`` plays a scheduler that keeps jobs by id, like the real one: a repeated
submit of a known id is re-acknowledged, not queued again, and a different job under a
known id (another client's, put there with :meth:`FakeClient.foreign`) is refused
``invalid_field job_id``; ``attach`` of an unknown id answers ``not_found``. Tests
finish jobs with :meth:`FakeClient.finish`.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from uniun.protocol.client import ClientError, SchedulerUnavailable, Timeout


def stable_id(job_id: str) -> str:
    """A producer's job id without its random tag (``actors/producers/ids.py``), which
    must be there."""
    stable, tag = job_id.rsplit("-", 1)
    assert re.fullmatch("[0-9a-f]{16}", tag), job_id
    return stable


class FakeStream:
    def __init__(self, client: FakeClient, job_id: str) -> None:
        self.client, self.job_id = client, job_id
        self.queue: deque[dict[str, Any]] = deque()
        self.ended = False

    def next_event(self, timeout: float | None = None) -> dict[str, Any] | None:
        if self.queue:
            event = self.queue.popleft()
            if event["type"] in ("done", "error"):
                self.ended = True
            return event
        if self.ended:
            return None
        raise Timeout("no events")

    def close(self) -> None:
        self.ended = True


class FakeClient:
    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}  # job_id -> job map, as the scheduler has it
        self.submits: list[str] = []  # every submit call, repeats included
        self.attaches: list[str] = []
        self.streams: dict[str, FakeStream] = {}
        self.down = False
        self.refuse: dict[str, str] = {}  # job_id -> error code to answer on submit
        self.lifecycle = "foreground"

    def submit(self, job: dict[str, Any], *, timeout: float | None = None) -> FakeStream:
        if self.down:
            raise SchedulerUnavailable("fake scheduler is down")
        job_id = job["job_id"]
        self.submits.append(job_id)
        if job_id in self.refuse:
            raise ClientError(self.refuse[job_id], "refused", job_id=job_id,
                              retryable=self.refuse[job_id] == "queue_full")
        if self.jobs.get(job_id, job) != job:
            raise ClientError("invalid_field", "job_id: a different job with this id was "
                              "already accepted", field="job_id", job_id=job_id)
        self.jobs.setdefault(job_id, dict(job))
        stream = self.streams.get(job_id) or FakeStream(self, job_id)
        self.streams[job_id] = stream
        return stream

    def attach(self, job_id: str, **_: Any) -> FakeStream:
        if self.down:
            raise SchedulerUnavailable("fake scheduler is down")
        self.attaches.append(job_id)
        if job_id not in self.jobs:
            raise ClientError("not_found", f"no job {job_id}", job_id=job_id)
        stream = FakeStream(self, job_id)
        self.streams[job_id] = stream
        return stream

    def status(self, **_: Any) -> dict[str, Any]:
        if self.down:
            raise SchedulerUnavailable("fake scheduler is down")
        return {"lifecycle": self.lifecycle}

    def foreign(self, job_id: str) -> None:
        """Another client's job takes ``job_id`` first."""
        self.jobs[job_id] = {"job_id": job_id, "kind": "nataraj", "prompt": "mine"}

    def finish(self, job_id: str, text: str, **extra: Any) -> None:
        event = {"type": "done", "job_id": job_id, "text": text, "finish_reason": "stop",
                 "usage": {"prompt_tokens": 5, "completion_tokens": 3},
                 "timings": {"queued_s": 0.1, "ttft_s": 0.2, "total_s": 0.5},
                 "preemptions": 0, **extra}
        self.streams[job_id].queue.append(event)

    def fail(self, job_id: str, code: str, retryable: bool = False) -> None:
        self.streams[job_id].queue.append({"type": "error", "job_id": job_id, "code": code,
                                           "message": "failed", "retryable": retryable})

    def unique_submits(self) -> list[str]:
        return list(dict.fromkeys(self.submits))
