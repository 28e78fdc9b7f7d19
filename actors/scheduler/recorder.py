"""What the scheduler core records about its own decisions: the timeline and the metrics.

The core calls one method here at each point of a job's life (accepted, dispatched,
paused, ended, ...) and this class adds to the same :class:`Effects` the values that
describe it, never doing I/O itself:

- **segments** (:class:`~uniun.actors.timeline.Segment` journal writes): every stretch
  a job held the runner (lane ``run``: start, end, tier, model, tokens, and why it ended)
  or waited for it (lane ``wait``: in the tier it was then dispatched from). A stretch is
  written when it ends, so the journal holds finished stretches only; ``uniun-runtime
  trace export`` turns them into a Chrome trace. **Marks** (:class:`~uniun.actors.timeline.Mark`):
  preempt, resume, swap, runner_lost, runner_up, scheduler_start. The open stretches are
  kept by :class:`~uniun.actors.timeline.Stretches`, the simulator's bookkeeping too.
- **observations** (:mod:`uniun.actors.observe` values) for the Prometheus metrics of
  :mod:`uniun.actors.metrics`.
- the last :data:`RECENT` marks, for ``status`` (``events``), which ``top`` shows.

Either half can be switched off (``trace.segments``, ``metrics.enabled``); the marks kept
for ``status`` are kept regardless (a deque of dicts, no I/O).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from uniun.actors.observe import Count, Level, Sample
from uniun.actors.policy import PolicyBase
from uniun.actors.policy.decision import Preempt, Run
from uniun.actors.policy.tiers import TIER_NAMES
from uniun.actors.scheduler.effects import Effects
from uniun.actors.scheduler.jobs import JobRecord
from uniun.actors.timeline import (
    Mark,
    MarkKind,
    Segment,
    Stretches,
    dispatch_marks,
    preempt_mark,
)

__all__ = ["Recorder", "RECENT", "DEPTH_EVERY_S"]

RECENT = 32  # marks kept for status / top
DEPTH_EVERY_S = 1.0  # the queue-depth gauge is recomputed at most this often (O(jobs))


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
        self._open = Stretches()
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.parking = (0, 0)  # trimmed, spilled (cumulative, from the runner)
        self._depth_next = float("-inf")
        self._depth_pending = False

    # ---- a job's life ---------------------------------------------------------------

    def accepted(self, fx: Effects, record: JobRecord) -> None:
        self._open.wait(record.spec, record.accepted_at, record.tier, first=True)
        if self.metrics:
            fx.observations.append(Count("jobs_accepted", _kt(record)))
        self._depth_pending = True

    def forget(self, job_id: str) -> None:
        """A job that was never accepted after all (its journal write failed)."""
        self._open.forget(job_id)

    def replayed(self, record: JobRecord) -> None:
        """A live job came back from the journal: it waits again from now."""
        self._open.wait(record.spec, self._wall(), record.tier, first=not record.started)

    def dispatched(self, fx: Effects, record: JobRecord, d: Run) -> None:
        now = self._wall()
        segment, wait = self._open.dispatch(record.spec, d, now, record.generated)
        self._segment(fx, segment)
        if wait is not None and self.metrics:
            if wait.first:
                fx.observations.append(Sample("queue_wait_seconds", now - wait.since,
                                              (("kind", record.spec.kind),)))
            elif wait.reason is not None:
                fx.observations.append(Sample("pause_seconds", now - wait.since,
                                              (("kind", record.spec.kind),
                                               ("reason", wait.reason))))
        for mark in dispatch_marks(d, now, record.generated, resumed=record.resumed):
            self._mark(fx, mark)
        if d.swap and self.metrics:
            fx.observations.append(Count("swaps", (("model", d.model_id),)))
        self._depth_pending = True

    def preempting(self, fx: Effects, d: Preempt) -> None:
        self._mark(fx, preempt_mark(d, self._wall()))

    def token(self, fx: Effects, record: JobRecord, seconds: float, first_of_job: bool) -> None:
        if not self.metrics:
            return
        run = self._open.run_of(record.job_id)
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
        self._open.wait(record.spec, self._wall(), record.tier, reason=reason)
        if self.metrics:
            fx.observations.append(Count("preemptions", (("reason", reason),)))

    def run_ended(self, fx: Effects, record: JobRecord, reason: str) -> None:
        self._segment(fx, self._open.end_run(record.job_id, self._wall(), reason,
                                             record.generated))
        self._depth_pending = True

    def ended(self, fx: Effects, record: JobRecord, final: dict[str, Any]) -> None:
        """The one end of a job (``CoreState._end``): close what is open, count it."""
        done = final.get("type") == "done"
        reason = "done" if done else str(final.get("code") or "failed")
        self.run_ended(fx, record, reason)
        self._segment(fx, self._open.end_wait(record.job_id, self._wall(), reason,
                                              record.tier))
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
        self._open.wait(record.spec, self._wall(), record.tier)

    def runner_up(self, fx: Effects, pid: int, model_id: str | None) -> None:
        self.mark(fx, "runner_up", None, f"pid {pid}, model {model_id or '-'}")

    def runner_stats(self, fx: Effects, count: int, nbytes: int, trimmed: int,
                     spilled: int) -> None:
        self.parking = (trimmed, spilled)
        if self.metrics:
            fx.observations.append(Level("parked_snapshots", count))
            fx.observations.append(Level("parked_snapshot_bytes", nbytes))

    def mark(self, fx: Effects, what: MarkKind, job_id: str | None = None,
             detail: str = "") -> None:
        self._mark(fx, Mark(what, self._wall(), job_id, detail))

    def _mark(self, fx: Effects, mark: Mark) -> None:
        self.recent.append(asdict(mark))
        if self.segments:
            fx.journal.append(mark)

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

    def _segment(self, fx: Effects, segment: Segment | None) -> None:
        if self.segments and segment is not None:
            fx.journal.append(segment)


def _kt(record: JobRecord) -> tuple[tuple[str, str], ...]:
    return (("kind", record.spec.kind), ("tier", f"T{record.tier}"))
