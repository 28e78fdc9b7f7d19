"""The baseline (docs/scheduling.md): one FIFO, no preemption, no affinity, no budgets.

It exists so that every benchmark can show UNIUN against what a plain queue does, behind
the same interface. It still keeps the facts straight (a job runs once at a time, ends
once, a cancel works), reports each job's nominal tier, and records foreground and
lifecycle for ``status`` — but it does not act on them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from uniun.actors.policy.base import PolicyBase
from uniun.actors.policy.decision import Decision, Idle, Run
from uniun.actors.policy.job import PolicyJob
from uniun.actors.policy.tiers import TIER_NAMES, tier_of


class FcfsPolicy(PolicyBase):
    """First come, first served: the runner takes the oldest job when it is free."""

    name = "fcfs"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fifo: OrderedDict[str, PolicyJob] = OrderedDict()

    def decide(self) -> Decision:
        if self._running is not None or not self._fifo:
            return Idle()
        now = self._clock()
        _, job = self._fifo.popitem(last=False)
        resume = job.dispatches > 0
        tier = self.tier(job, now)
        swap = self._dispatched(job, now, tier, None)
        return Run(job_id=job.job_id, model_id=job.model_id, resume=resume, swap=swap,
                   token_grant=None, tier=tier)

    def tier(self, job: PolicyJob, now: float) -> int:
        return tier_of(job, now=now, foreground=self.foreground, config=self.config)

    def _enqueue(self, job: PolicyJob, *, front: bool) -> None:
        # Only a runner-initiated pause or a fail-over re-queues here: it goes first.
        self._fifo[job.job_id] = job
        if front:
            self._fifo.move_to_end(job.job_id, last=False)

    def _dequeue(self, job: PolicyJob) -> None:
        del self._fifo[job.job_id]

    def status(self) -> dict[str, Any]:
        now = self._clock()
        queues: dict[str, list[str]] = {name: [] for name in TIER_NAMES}
        for job in self._fifo.values():
            queues[TIER_NAMES[self.tier(job, now)]].append(job.job_id)
        return {
            "policy": self.name,
            "lifecycle": self.lifecycle,
            "foreground": self.foreground,
            "loaded_model": self.loaded_model,
            "running": None if self._running is None else self._running.summary(),
            "queues": queues,
            "fifo": list(self._fifo),
            "held": [],
            "vruntime": {},
            "t2_share": 0.0,
            "swaps": self.swaps,
            "preemptions": self.preemptions,
        }
