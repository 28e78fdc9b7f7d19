"""Test helpers for the policy room: a fake clock and a fake runner that drives a policy
the way the scheduler process does (report, decide, act)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from uniun.actors.policy import (
    Decision,
    Idle,
    PolicyConfig,
    Preempt,
    ReportOutcome,
    Run,
    make_policy,
)
from uniun.protocol.jobmap import JobSpec, validate_job

MODEL = "m-chat"


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> float:
        self.t += seconds
        return self.t


def spec(job_id: str, kind: str, **fields: Any) -> JobSpec:
    """A validated job (the wire map's defaults filled in)."""
    raw = {"job_id": job_id, "kind": kind, "prompt": "p", **fields}
    return validate_job(raw, default_model=MODEL)


@dataclass
class Segment:
    job_id: str
    start: float
    end: float | None = None
    how: str = ""


@dataclass
class FakeRunner:
    """Drives ``policy`` like a host: one decode step produces ``tokens_per_step`` tokens
    in ``step_s`` seconds; a pending Preempt/cancel takes effect at the next step (the
    next token boundary); a job finishes after ``target[job_id]`` tokens (default its
    max_new_tokens); its start reports ``prompts[job_id]`` prompt tokens (default 0)."""

    policy: Any
    clock: FakeClock
    step_s: float = 0.1
    tokens_per_step: int = 1
    target: dict[str, int] = field(default_factory=dict)
    running: str | None = None
    grant_left: int | None = None
    stop: str | None = None          # "pause" | "cancel"
    stop_reason: str = "preempted"
    timeline: list[Segment] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)
    produced: dict[str, int] = field(default_factory=dict)
    prompts: dict[str, int] = field(default_factory=dict)  # prompt tokens, per job

    def decide(self) -> Decision:
        decision = self.policy.decide()
        self.decisions.append(decision)
        if isinstance(decision, Run):
            assert self.running is None, "Run while the runner is busy"
            self.running = decision.job_id
            self.grant_left = decision.token_grant
            self.stop = None
            self.timeline.append(Segment(decision.job_id, self.clock.t))
            self.policy.on_started(decision.job_id, self.prompts.get(decision.job_id, 0))
        elif isinstance(decision, Preempt):
            assert self.running == decision.running_job_id
            assert self.stop is None, "asked to preempt twice"
            self.stop, self.stop_reason = "pause", decision.reason
        return decision

    def cancel(self, job_id: str) -> None:
        from uniun.actors.policy import CancelOutcome
        outcome = self.policy.cancel(job_id)
        if outcome is CancelOutcome.REMOVED:
            self.outcomes[job_id] = "cancelled"
        elif outcome is CancelOutcome.STOP_RUNNING:
            assert self.running == job_id
            self.stop = "cancel"

    def _end_segment(self, how: str) -> None:
        self.timeline[-1].end = self.clock.t
        self.timeline[-1].how = how
        self.running = None
        self.stop = None

    def step(self) -> None:
        """One decode step of the running job (if any), then a decision."""
        self.clock.advance(self.step_s)
        job_id = self.running
        if job_id is not None:
            want = self.target.get(job_id)
            if want is None:
                want = self.policy.job(job_id).spec.max_new_tokens
            done = self.produced.get(job_id, 0)
            n = min(self.tokens_per_step, want - done)
            if self.grant_left is not None:
                n = min(n, self.grant_left)
                self.grant_left -= n
            self.produced[job_id] = done + n
            self.policy.on_tokens(job_id, n, self.step_s)
            if self.produced[job_id] >= want:
                self.policy.on_finished(job_id, 0.0)
                self.outcomes[job_id] = "done"
                self._end_segment("done")
            elif self.stop == "cancel":
                self.policy.on_cancelled(job_id, 0.0)
                self.outcomes[job_id] = "cancelled"
                self._end_segment("cancelled")
            elif self.stop == "pause" or self.grant_left == 0:
                reason = self.stop_reason if self.stop == "pause" else "budget"
                outcome = self.policy.on_paused(job_id, 0.0, reason)
                if outcome is ReportOutcome.CHAT_INTERRUPTED:
                    self.outcomes[job_id] = "failed"
                self._end_segment(f"paused:{reason}")
        self.decide()

    def run_for(self, seconds: float) -> None:
        end = self.clock.t + seconds - 1e-9
        while self.clock.t < end:
            self.step()

    def run_until_idle(self, limit_s: float = 10_000.0) -> None:
        end = self.clock.t + limit_s
        while self.clock.t < end:
            if self.running is None:
                decision = self.decide()
                if isinstance(decision, Idle):
                    if decision.wake_at is None:
                        return
                    self.clock.t = max(self.clock.t, decision.wake_at)
                    continue
            self.step()
        raise AssertionError("the policy did not drain in time")

    def runner_seconds(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for seg in self.timeline:
            end = seg.end if seg.end is not None else self.clock.t
            out[seg.job_id] = out.get(seg.job_id, 0.0) + (end - seg.start)
        return out


def uniun(config: PolicyConfig | None = None, *, model: str | None = MODEL,
          name: str = "uniun") -> tuple[Any, FakeClock]:
    """A fresh policy on a fake clock (wall clock = the same fake clock)."""
    clock = FakeClock()
    policy = make_policy(name, config, clock, wall_clock=clock)
    if model is not None:
        policy.on_model_loaded(model)
    return policy, clock
