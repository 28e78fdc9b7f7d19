"""The simulator's timeline: the same segments and marks the scheduler journals.

``uniun-runtime simulate TRACE --trace-out FILE.json`` turns them into the same Chrome
trace as ``uniun-runtime trace export`` (``runtime/timeline.py``), so a simulated run and
a real one can be opened side by side. The records and the bookkeeping of open waits and
runs are the scheduler's own (:mod:`uniun.actors.timeline`); times are trace seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from uniun.actors.policy import Run
from uniun.actors.timeline import Mark, Segment, Stretches, dispatch_marks
from uniun.protocol.jobmap import JobSpec

__all__ = ["SimTimeline"]


@dataclass
class SimTimeline:
    """Collects segments and marks as the simulation runs (the hooks mirror the
    scheduler core's :class:`~uniun.actors.scheduler.recorder.Recorder`)."""

    segments: list[Segment] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    _open: Stretches = field(default_factory=Stretches)
    _specs: dict[str, JobSpec] = field(default_factory=dict)

    def submitted(self, spec: JobSpec, tier: int, now: float) -> None:
        self._specs[spec.job_id] = spec
        self._open.wait(spec, now, tier)

    def dispatched(self, run: Run, tokens: int, now: float) -> None:
        self._add(self._open.dispatch(self._specs[run.job_id], run, now, tokens)[0])
        self.marks.extend(dispatch_marks(run, now, tokens, resumed=run.resume))

    def run_ended(self, job_id: str, reason: str, tokens: int, now: float, *,
                  waits_again: bool) -> None:
        run = self._open.run_of(job_id)
        if run is not None:
            self._add(self._open.end_run(job_id, now, reason, tokens))
            if waits_again:
                self._open.wait(run.spec, now, run.tier)

    def cancelled_waiting(self, job_id: str, now: float) -> None:
        self._add(self._open.end_wait(job_id, now, "cancelled"))

    def mark(self, mark: Mark) -> None:
        self.marks.append(mark)

    def _add(self, segment: Segment | None) -> None:
        if segment is not None:
            self.segments.append(segment)
