"""Which tier a job is in, and the indexes that make a pick cheap.

A job's tier depends on the moment (foreground kind, whether its deadline has passed),
so it is computed, never stored. What is stored is an index that does not depend on the
moment: waiting jobs are kept in *buckets* of jobs that always share a tier and a model,
keyed by (kind, flow, model, foreground_hint, client); the client only for chats, whose
order across clients is their fair share (chatshare.py). A bucket is a FIFO (the front is what it
would give next). There are few buckets (kinds x flows x models), so a pick looks at
bucket fronts, never at every job: with 10,000 queued jobs a pick costs what a few dozen
fronts cost. Overdue jobs (deadline passed) are found through one earliest-deadline heap
per kind, and the next promotion through one heap of future deadlines.

Heaps are lazy: an entry whose job has left the bucket, or has re-entered with a new
key, is skipped when it reaches the top.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Iterator
from typing import NamedTuple

from uniun.actors.policy.config import PolicyConfig
from uniun.actors.policy.job import PolicyJob

T0, T1, T2, T3, T4 = 0, 1, 2, 3, 4
# The five tiers, declared once: the name the status's queues are keyed by, and what the
# tier holds. ``top`` and the console (which gets them in its feed's snapshot) show both.
TIERS: tuple[tuple[str, str], ...] = (("T0", "chat"), ("T1", "foreground"),
                                      ("T2", "extract"), ("T3", "deadline"),
                                      ("T4", "fair pool"))
TIER_NAMES: tuple[str, ...] = tuple(name for name, _ in TIERS)
TIER_LABELS: tuple[str, ...] = tuple(f"{name} {what}" for name, what in TIERS)


def tier_of(job: PolicyJob, *, now: float, foreground: str | None,
            config: PolicyConfig) -> int:
    """The tier of ``job`` at ``now`` (docs/scheduling.md, "The five tiers"; first match wins)."""
    kind = job.spec.kind
    if kind == config.chat_kind:
        return T0
    if kind == foreground and (kind != config.extract_kind or job.spec.foreground_hint):
        return T1
    if kind == config.extract_kind:
        return T2
    if job.deadline_at is not None and job.deadline_at <= now:
        return T3
    return T4


class BucketKey(NamedTuple):
    kind: str
    flow: str
    model: str
    hint: bool
    client: str = ""  # a chat's client; "" for every other kind


class Bucket:
    """Waiting jobs that share kind, flow, model and foreground hint, in pick order."""

    __slots__ = ("key", "jobs", "_waits")

    def __init__(self, key: BucketKey) -> None:
        self.key = key
        self.jobs: OrderedDict[str, PolicyJob] = OrderedDict()
        self._waits: list[tuple[float, int, str]] = []  # (waiting_since, key, job_id)

    def __len__(self) -> int:
        return len(self.jobs)

    def push(self, job: PolicyJob, *, front: bool) -> None:
        self.jobs[job.job_id] = job
        if front:
            self.jobs.move_to_end(job.job_id, last=False)
        heapq.heappush(self._waits, (job.waiting_since, job.key, job.job_id))

    def remove(self, job: PolicyJob) -> None:
        del self.jobs[job.job_id]
        if len(self._waits) > 2 * len(self.jobs) + 64:  # drop stale entries, keep it O(n)
            self._waits = [(j.waiting_since, j.key, j.job_id) for j in self.jobs.values()]
            heapq.heapify(self._waits)

    def front(self) -> PolicyJob:
        return next(iter(self.jobs.values()))

    def oldest_wait(self) -> float:
        """The earliest ``waiting_since`` of the bucket's jobs (for starvation)."""
        waits = self._waits
        while waits:
            since, key, job_id = waits[0]
            job = self.jobs.get(job_id)
            if job is not None and job.key == key:
                return since
            heapq.heappop(waits)
        raise LookupError("empty bucket")


class TierIndex:
    """Every waiting (not held) job, by bucket, plus the deadline heaps."""

    def __init__(self) -> None:
        self.buckets: dict[BucketKey, Bucket] = {}
        self._where: dict[str, BucketKey] = {}
        self._back = itertools.count(1)
        self._front = itertools.count(-1, -1)
        # kind -> heap of (deadline_at, key, job_id), for earliest-deadline-first in T3.
        self._edf: dict[str, list[tuple[float, int, str]]] = {}
        # All future deadlines, for the promotion timer.
        self._promotions: list[tuple[float, int, str]] = []

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._where

    def add(self, job: PolicyJob, *, front: bool, extract_kind: str,
            chat_kind: str = "chat") -> None:
        """Queue ``job`` at the back of its bucket, or at the front (a paused job)."""
        job.key = next(self._front) if front else next(self._back)
        hint = job.spec.foreground_hint and job.spec.kind == extract_kind
        client = job.client if job.spec.kind == chat_kind else ""
        bkey = BucketKey(job.spec.kind, job.flow, job.model_id, hint, client)
        bucket = self.buckets.get(bkey)
        if bucket is None:
            bucket = self.buckets[bkey] = Bucket(bkey)
        bucket.push(job, front=front)
        self._where[job.job_id] = bkey
        if job.deadline_at is not None:
            entry = (job.deadline_at, job.key, job.job_id)
            heapq.heappush(self._edf.setdefault(job.spec.kind, []), entry)
            heapq.heappush(self._promotions, entry)

    def remove(self, job: PolicyJob) -> None:
        bkey = self._where.pop(job.job_id)
        bucket = self.buckets[bkey]
        bucket.remove(job)
        if not bucket.jobs:
            del self.buckets[bkey]
        if job.deadline_at is not None:
            heap = self._edf.get(job.spec.kind)
            if heap is not None and len(heap) > 2 * len(self._where) + 64:
                self._edf[job.spec.kind] = self._compact(heap)
            if len(self._promotions) > 2 * len(self._where) + 64:
                self._promotions = self._compact(self._promotions)

    def _compact(self, heap: list[tuple[float, int, str]]) -> list[tuple[float, int, str]]:
        """The heap without its stale entries (keeps memory O(live jobs))."""
        live = [entry for entry in heap if self._live(entry)]
        heapq.heapify(live)
        return live

    def _live(self, entry: tuple[float, int, str]) -> bool:
        bkey = self._where.get(entry[2])
        if bkey is None:
            return False
        job = self.buckets[bkey].jobs[entry[2]]
        return job.key == entry[1]

    def job(self, job_id: str) -> PolicyJob:
        return self.buckets[self._where[job_id]].jobs[job_id]

    def earliest_overdue(self, kind: str, now: float) -> PolicyJob | None:
        """The waiting job of ``kind`` with the earliest passed deadline (ties FIFO)."""
        heap = self._edf.get(kind)
        while heap:
            entry = heap[0]
            if not self._live(entry):
                heapq.heappop(heap)
                continue
            return self.job(entry[2]) if entry[0] <= now else None
        return None

    def next_promotion(self, now: float) -> float | None:
        """The earliest deadline still in the future (drops passed and stale ones)."""
        heap = self._promotions
        while heap:
            entry = heap[0]
            if entry[0] <= now or not self._live(entry):
                heapq.heappop(heap)
                continue
            return entry[0]
        return None

    def deadline_kinds(self) -> Iterator[str]:
        return iter(self._edf)

    def jobs(self) -> Iterator[PolicyJob]:
        for bucket in self.buckets.values():
            yield from bucket.jobs.values()
