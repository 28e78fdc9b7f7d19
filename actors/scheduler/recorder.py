"""What the scheduler core records about its own decisions: the timeline and the metrics.

The core calls one method here at each point of a job's life (accepted, dispatched,
paused, ended, ...) and this class adds to the same :class:`Effects` the values that
describe it, never doing I/O itself:

- **segments** (``JSegment`` journal writes): every stretch a job held the runner (lane
  ``run``: start, end, tier, model, tokens, and why it ended) or waited for it (lane
  ``wait``: in the tier it was then dispatched from). A stretch is written when it ends,
  so the journal holds finished stretches only; ``uniun-runtime trace export`` turns them
  into a Chrome trace. **Marks** (``JMark``): preempt, resume, swap, runner_lost,
  runner_up, scheduler_start.
- **observations** (:mod:`uniun.actors.observe` values) for the Prometheus metrics of
  :mod:`uniun.actors.metrics`.
- the last :data:`RECENT` marks, for ``status`` (``events``), which ``top`` shows.

Either half can be switched off (``trace.segments``, ``metrics.enabled``); the marks kept
for ``status`` are kept regardless (a deque of dicts, no I/O).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uniun.actors.observe import Count, Level, Sample
from uniun.actors.policy import PolicyBase
from uniun.actors.policy.decision import Preempt, Run
from uniun.actors.policy.tiers import TIER_NAMES
from uniun.actors.scheduler.effects import Effects, JMark, JSegment
from uniun.actors.scheduler.jobs import JobRecord

__all__ = ["Recorder", "RECENT", "DEPTH_EVERY_S"]

RECENT = 32  # marks kept for status / top
DEPTH_EVERY_S = 1.0  # the queue-depth gauge is recomputed at most this often (O(jobs))


@dataclass(slots=True)
class _Wait:
    since: float  # unix seconds
    first: bool  # never dispatched yet (its end is the queue wait)
    reason: str | None  # why it was paused (its end is a pause), None: do not observe


@dataclass(slots=True)
class _Run:
    start: float
    tokens0: int  # tokens the job had before this segment
    tier: int
    model_id: str


class Recorder:
    """See the module docstring. ``wall``: unix seconds (what is journaled); ``clock``:
    the policy's clock (the depth gauge's throttle and the wake it asks for)."""

    def __init__(self, *, wall: Callable[[], float], clock: Callable[[], float],
                 chat_kind: str, segments: bool = True, metrics: bool = True) -> None:
        self._wall = wall
        self._clock = clock
        self.chat_kind = chat_kind
        self.segments = segments
        self.metrics = metrics
        self._waits: dict[str, _Wait] = {}
        self._runs: dict[str, _Run] = {}
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.parking = (0, 0)  # trimmed, spilled (cumulative, from the runner)
        self._depth_next = float("-inf")
        self._depth_pending = False

    # ---- a job's life ---------------------------------------------------------------

    def accepted(self, fx: Effects, record: JobRecord) -> None:
        self._waits[record.job_id] = _Wait(record.accepted_at, True, None)
        if self.metrics:
            fx.observations.append(Count("jobs_accepted", _kt(record)))
        self._depth_pending = True

    def forget(self, job_id: str) -> None:
        """A job that was never accepted after all (its journal write failed)."""
        self._waits.pop(job_id, None)
        self._runs.pop(job_id, None)

    def replayed(self, record: JobRecord) -> None:
        """A live job came back from the journal: it waits again from now."""
        self._waits[record.job_id] = _Wait(self._wall(), not record.started, None)

    def dispatched(self, fx: Effects, record: JobRecord, d: Run) -> None:
        now = self._wall()
        wait = self._waits.pop(record.job_id, None)
        if wait is not None:
            self._segment(fx, record, "wait", d.tier, wait.since, now, "dispatched")
            if self.metrics:
                if wait.first:
                    fx.observations.append(Sample("queue_wait_seconds", now - wait.since,
                                                  (("kind", record.spec.kind),)))
                elif wait.reason is not None:
                    fx.observations.append(Sample("pause_seconds", now - wait.since,
                                                  (("kind", record.spec.kind),
                                                   ("reason", wait.reason))))
        self._runs[record.job_id] = _Run(now, record.generated, d.tier, d.model_id)
        if d.swap:
            self.mark(fx, "swap", record.job_id, f"load {d.model_id}")
            if self.metrics:
                fx.observations.append(Count("swaps", (("model", d.model_id),)))
        if record.resumed:
            self.mark(fx, "resume", record.job_id,
                      f"T{d.tier} after {record.generated} tokens")
        self._depth_pending = True

    def preempting(self, fx: Effects, d: Preempt) -> None:
        detail = d.reason + (f" for {d.for_job_id}" if d.for_job_id else "")
        self.mark(fx, "preempt", d.running_job_id, detail)

    def token(self, fx: Effects, record: JobRecord, seconds: float, first_of_job: bool) -> None:
        if not self.metrics:
            return
        run = self._runs.get(record.job_id)
        first = run is None or record.generated - run.tokens0 <= 1
        obs = fx.observations
        obs.append(Count("tokens_generated", (("kind", record.spec.kind),)))
        obs.append(Sample("runner_step_seconds", seconds,
                          (("phase", "first" if first else "decode"),)))
        if first_of_job and record.spec.kind == self.chat_kind \
                and record.first_token_at is not None:
            obs.append(Sample("chat_ttft_seconds", record.first_token_at - record.accepted_at))

    def paused(self, fx: Effects, record: JobRecord, reason: str) -> None:
        """The running job was parked and waits again (re-queued or held)."""
        self.run_ended(fx, record, reason)
        self._waits[record.job_id] = _Wait(self._wall(), False, reason)
        if self.metrics:
            fx.observations.append(Count("preemptions", (("reason", reason),)))

    def run_ended(self, fx: Effects, record: JobRecord, reason: str) -> None:
        run = self._runs.pop(record.job_id, None)
        if run is not None:
            self._segment(fx, record, "run", run.tier, run.start, self._wall(), reason,
                          record.generated - run.tokens0, model_id=run.model_id)
        self._depth_pending = True

    def ended(self, fx: Effects, record: JobRecord, final: dict[str, Any]) -> None:
        """The one end of a job (``CoreState._end``): close what is open, count it."""
        done = final.get("type") == "done"
        reason = "done" if done else str(final.get("code") or "failed")
        self.run_ended(fx, record, reason)
        wait = self._waits.pop(record.job_id, None)
        if wait is not None:
            self._segment(fx, record, "wait", record.tier, wait.since, self._wall(), reason)
        if self.metrics:
            if done:
                fx.observations.append(Count("jobs_done", _kt(record)))
            else:
                fx.observations.append(Count("jobs_failed",
                                             (*_kt(record), ("code", reason))))

    # ---- the runner and the process -------------------------------------------------

    def runner_lost(self, fx: Effects, record: JobRecord | None, reason: str) -> None:
        self.mark(fx, "runner_lost", record.job_id if record else None, reason)
        if record is not None:
            self.run_ended(fx, record, "runner_lost")

    def requeued(self, record: JobRecord) -> None:
        """A job failed over from a lost runner waits again (not a pause)."""
        self._waits[record.job_id] = _Wait(self._wall(), False, None)

    def runner_up(self, fx: Effects, pid: int, model_id: str | None) -> None:
        self.mark(fx, "runner_up", None, f"pid {pid}, model {model_id or '-'}")

    def runner_stats(self, fx: Effects, count: int, nbytes: int, trimmed: int,
                     spilled: int) -> None:
        self.parking = (trimmed, spilled)
        if self.metrics:
            fx.observations.append(Level("parked_snapshots", count))
            fx.observations.append(Level("parked_snapshot_bytes", nbytes))

    def mark(self, fx: Effects, what: str, job_id: str | None = None, detail: str = "") -> None:
        at = self._wall()
        self.recent.append({"what": what, "at": at, "job_id": job_id, "detail": detail})
        if self.segments:
            fx.journal.append(JMark(what, at, job_id, detail))

    # ---- the queue-depth gauge ------------------------------------------------------

    def depths(self, fx: Effects, policy: PolicyBase) -> float | None:
        """After a pump: refresh the gauge if due; the clock time to be woken for a
        refresh that had to wait (None: nothing pending)."""
        if not self.metrics or not self._depth_pending:
            return None
        now = self._clock()
        if now < self._depth_next:
            return self._depth_next
        self._depth_pending = False
        self._depth_next = now + DEPTH_EVERY_S
        for name, depth in zip(TIER_NAMES, policy.queue_depths()):
            fx.observations.append(Level("queue_depth", depth, (("tier", name),)))
        return None

    # ---- status ---------------------------------------------------------------------

    def status_extra(self) -> dict[str, Any]:
        return {"events": list(self.recent),
                "parking": {"trimmed": self.parking[0], "spilled": self.parking[1]}}

    def _segment(self, fx: Effects, record: JobRecord, lane: str, tier: int, start: float,
                 end: float, reason: str, tokens: int = 0, *,
                 model_id: str | None = None) -> None:
        if self.segments:
            spec = record.spec
            fx.journal.append(JSegment(spec.job_id, lane, spec.kind, spec.flow or spec.kind,
                                       tier, model_id or spec.model_id, start, end, reason,
                                       tokens))


def _kt(record: JobRecord) -> tuple[tuple[str, str], ...]:
    return (("kind", record.spec.kind), ("tier", f"T{record.tier}"))
