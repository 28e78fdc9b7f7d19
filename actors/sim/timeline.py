"""The simulator's timeline: the same segments and marks the scheduler journals.

``uniun-runtime simulate TRACE --trace-out FILE.json`` turns them into the same Chrome
trace as ``uniun-runtime trace export`` (``runtime/timeline.py``), so a simulated run and
a real one can be opened side by side. Field names and reasons follow
``actors/scheduler/effects.py`` (``JSegment``, ``JMark``); times are trace seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from uniun.actors.policy import Run
from uniun.protocol.jobmap import JobSpec

__all__ = ["SimTimeline", "Segment", "Mark"]


@dataclass(frozen=True)
class Segment:
    job_id: str
    lane: str  # run | wait
    kind: str
    flow: str
    tier: int
    model_id: str
    start: float
    end: float
    reason: str
    tokens: int = 0


@dataclass(frozen=True)
class Mark:
    what: str
    at: float
    job_id: str | None = None
    detail: str = ""


@dataclass
class _Open:
    since: float
    tier: int
    tokens0: int = 0
    model_id: str = ""


@dataclass
class SimTimeline:
    """Collects segments and marks as the simulation runs (the hooks mirror the
    scheduler core's :class:`~uniun.actors.scheduler.recorder.Recorder`)."""

    segments: list[Segment] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    _specs: dict[str, JobSpec] = field(default_factory=dict)
    _waits: dict[str, _Open] = field(default_factory=dict)
    _runs: dict[str, _Open] = field(default_factory=dict)

    def submitted(self, spec: JobSpec, tier: int, now: float) -> None:
        self._specs[spec.job_id] = spec
        self._waits[spec.job_id] = _Open(now, tier)

    def dispatched(self, run: Run, tokens: int, now: float) -> None:
        wait = self._waits.pop(run.job_id, None)
        if wait is not None:
            self._add(run.job_id, "wait", run.tier, wait.since, now, "dispatched")
        self._runs[run.job_id] = _Open(now, run.tier, tokens, run.model_id)
        if run.swap:
            self.mark("swap", run.job_id, f"load {run.model_id}", now)
        if run.resume:
            self.mark("resume", run.job_id, f"T{run.tier} after {tokens} tokens", now)

    def run_ended(self, job_id: str, reason: str, tokens: int, now: float, *,
                  waits_again: bool) -> None:
        run = self._runs.pop(job_id, None)
        if run is not None:
            self._add(job_id, "run", run.tier, run.since, now, reason, tokens - run.tokens0,
                      model_id=run.model_id)
            if waits_again:
                self._waits[job_id] = _Open(now, run.tier)

    def cancelled_waiting(self, job_id: str, now: float) -> None:
        wait = self._waits.pop(job_id, None)
        if wait is not None:
            self._add(job_id, "wait", wait.tier, wait.since, now, "cancelled")

    def mark(self, what: str, job_id: str | None, detail: str, now: float) -> None:
        self.marks.append(Mark(what, now, job_id, detail))

    def _add(self, job_id: str, lane: str, tier: int, start: float, end: float, reason: str,
             tokens: int = 0, *, model_id: str | None = None) -> None:
        spec = self._specs[job_id]
        self.segments.append(Segment(job_id, lane, spec.kind, spec.flow or spec.kind, tier,
                                     model_id or spec.model_id, start, end, reason, tokens))
