"""Discrete-event replay of a workload trace against a policy, with a cost model.

It shows what a policy is worth without a model: the simulated runner costs
``prefill_ms_per_token`` per prompt token before the first token of a fresh dispatch,
``decode_ms_per_token`` per further token (and one decode step for the first token of a
resumed dispatch: the snapshot is assumed kept), and ``swap_s`` to load another model.
The runner stops at the next token boundary, or during a prefill at the next chunk of
``prefill_chunk_tokens`` (the prefilled part is kept), and never during a swap.
Swap time is runner time but no job's: it is not charged to a flow.

The loop jumps from event to event (trace line, start, token boundary where the runner
stops, the policy's ``wake_at``) and drives the policy exactly like the scheduler
process does: report what the runner did, apply the trace's inputs, ``decide()``, act.
It runs until every job has ended and nothing is left to happen; jobs still alive then
are ``lost`` (a correct policy loses none on a trace that ends in the foreground).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from uniun.actors.policy import (
    CancelOutcome,
    Idle,
    PolicyConfig,
    Preempt,
    ReportOutcome,
    Run,
    make_policy,
)
from uniun.actors.sim.timeline import SimTimeline
from uniun.actors.sim.trace import Cancel, Foreground, Lifecycle, Submit, TraceEvent
from uniun.actors.timeline import preempt_mark

# A trace that still has work this long after its last line has a policy that never
# finishes it: stop and count what is left as lost.
HORIZON_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class CostModel:
    """What the simulated runner's work costs. Defaults: SmolLM2-135M on the machine class
    the project targets (docs/design.md §7); pass the figures of another machine or model
    (``simulate --prefill-ms-per-token/--decode-ms-per-token/--swap-s``)."""

    prefill_ms_per_token: float = 3.4  # prompt tokens, ms each (default 3.4)
    decode_ms_per_token: float = 9.3  # generated tokens, ms each (default 9.3)
    # One model swap, seconds (default 0.87): of the order `uniun-runtime bench-swaps`
    # measures between SmolLM2-135M and Gemma 3 270M (``measured_swap_s`` in
    # bench/results/swaps-multi-model.json; docs/models.md, "Swap benchmark").
    swap_s: float = 0.87
    # The runner prefills in chunks of this many tokens and can stop between them.
    prefill_chunk_tokens: int = 64

    def __post_init__(self) -> None:
        if self.prefill_chunk_tokens < 1:
            raise ValueError("prefill_chunk_tokens must be >= 1")
        for name in ("prefill_ms_per_token", "decode_ms_per_token", "swap_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0")
        if self.decode_ms_per_token <= 0:
            raise ValueError("decode_ms_per_token must be > 0")


@dataclass
class JobRecord:
    """One job's life in the simulation (times in trace seconds)."""

    job_id: str
    kind: str
    flow: str
    submit: float
    target: int                      # tokens it produces before stopping by itself
    tokens: int = 0
    prompt_tokens: int = 0
    prefilled: int = 0               # prompt tokens in the (kept) KV cache
    first_start: float | None = None
    first_token: float | None = None
    end: float | None = None
    outcome: str | None = None       # done | cancelled | failed
    pauses: int = 0


@dataclass
class _Segment:
    """One dispatch on the simulated runner, and where it will end."""

    job_id: str
    compute_start: float     # after the swap, if any
    prefill_todo: int        # prompt tokens this dispatch still has to prefill
    first_at: float          # time of this dispatch's first token
    limit: int               # tokens this dispatch produces unless stopped (grant / done)
    end_count: int           # tokens it will have produced when it ends
    end_at: float            # when it ends (last token, or the boundary where it stops)
    prefilled: int           # prompt tokens prefilled by then
    started: bool = False
    reported: int = 0        # tokens already reported to the policy
    last_report: float = 0.0
    stop: str | None = None  # "pause" | "cancel"
    reason: str = "preempted"  # pause reason the policy gave

    def emitted(self, t: float, decode_s: float) -> int:
        if t < self.first_at:
            return 0
        return min(self.end_count,
                   1 + math.floor((t - self.first_at) / decode_s + 1e-9))


@dataclass
class SimResult:
    policy: str
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    flow_runner_s: dict[str, float] = field(default_factory=dict)
    swaps: int = 0
    preemptions: int = 0
    end_time: float = 0.0


class Simulation:
    """Replays ``events`` against a fresh policy of ``policy_name``."""

    def __init__(self, policy_name: str, events: list[TraceEvent],
                 cost: CostModel | None = None, *, config: PolicyConfig | None = None,
                 default_model: str = "smollm2-135m-instruct") -> None:
        self.cost = cost or CostModel()
        self.now = 0.0
        self.policy = make_policy(policy_name, config, clock=self._clock,
                                  wall_clock=self._clock)
        self.policy.on_model_loaded(default_model)
        self._events = list(events)
        self._decode = self.cost.decode_ms_per_token / 1000.0
        self._prefill = self.cost.prefill_ms_per_token / 1000.0
        self._seg: _Segment | None = None
        self._wake: float | None = None
        self.result = SimResult(policy=policy_name)
        self._prompt: dict[str, int] = {}
        self.timeline = SimTimeline()  # segments and marks, for --trace-out

    def _clock(self) -> float:
        return self.now

    # --- the loop ------------------------------------------------------------------------
    def run(self, until: float | None = None) -> SimResult:
        """Simulate until everything has ended (or, given ``until``, until that time)."""
        events, i = self._events, 0
        last_t = events[-1].t if events else 0.0
        stop = last_t + HORIZON_S if until is None else until
        while True:
            t_event = events[i].t if i < len(events) else math.inf
            t = min(t_event, self._runner_next(), self._wake or math.inf)
            if t == math.inf or t > stop:
                if until is not None:
                    self.now = max(self.now, until)
                    self._report_progress()
                break
            self.now = max(self.now, t)
            self._runner_step()
            while i < len(events) and events[i].t <= self.now:
                self._apply(events[i])
                i += 1
            self._report_progress()
            self._act(self.policy.decide())
        self.result.end_time = self.now
        self.result.swaps = self.policy.swaps
        return self.result

    def _apply(self, event: TraceEvent) -> None:
        policy = self.policy
        if isinstance(event, Submit):
            spec = event.spec
            self.result.jobs[spec.job_id] = JobRecord(
                job_id=spec.job_id, kind=spec.kind, flow=spec.flow or spec.kind,
                submit=self.now, target=min(event.new_tokens, spec.max_new_tokens),
                prompt_tokens=event.prompt_tokens)
            self.timeline.submitted(spec, policy.submit(spec), self.now)
        elif isinstance(event, Cancel):
            outcome = policy.cancel(event.job_id)
            if outcome is CancelOutcome.REMOVED:
                self.timeline.cancelled_waiting(event.job_id, self.now)
                self._ended(event.job_id, "cancelled")
            elif outcome is CancelOutcome.STOP_RUNNING and self._seg is not None:
                self._request_stop("cancel")
        elif isinstance(event, Foreground):
            policy.set_foreground(event.kind)
        elif isinstance(event, Lifecycle):
            policy.set_lifecycle(event.state)

    def _act(self, decision: Any) -> None:
        self._wake = decision.wake_at
        if isinstance(decision, Run):
            self._start(decision)
        elif isinstance(decision, Preempt):
            self.timeline.mark(preempt_mark(decision, self.now))
            self._request_stop("pause", decision.reason)
        else:
            assert isinstance(decision, Idle)

    # --- the simulated runner --------------------------------------------------------------
    def _start(self, run: Run) -> None:
        record = self.result.jobs[run.job_id]
        if record.first_start is None:
            record.first_start = self.now
        self.timeline.dispatched(run, record.tokens, self.now)
        compute_start = self.now + (self.cost.swap_s if run.swap else 0.0)
        todo = record.prompt_tokens - record.prefilled
        if todo > 0:  # fresh, or paused during its prefill: the first token ends prefill
            first_at = compute_start + todo * self._prefill
        else:         # resumed from its snapshot: one decode step to the next token
            first_at = compute_start + self._decode
        remaining = record.target - record.tokens
        limit = remaining if run.token_grant is None else min(remaining, run.token_grant)
        limit = max(limit, 1)
        self._seg = _Segment(run.job_id, compute_start, todo, first_at, limit,
                             end_count=limit, end_at=first_at + (limit - 1) * self._decode,
                             prefilled=record.prompt_tokens, last_report=compute_start)

    def _request_stop(self, kind: str, reason: str = "preempted") -> None:
        """The runner checks for control messages between tokens and between prefill
        chunks: the token or chunk in progress completes, then it stops."""
        seg = self._seg
        assert seg is not None
        if seg.stop == "cancel":
            return
        seg.stop, seg.reason = kind, reason
        now = self.now
        if now < seg.compute_start:      # a swap is not interrupted
            end_at, count, prefilled = seg.compute_start, 0, seg.prefilled - seg.prefill_todo
        elif now < seg.first_at and seg.prefill_todo > 0:
            chunk_s = self.cost.prefill_chunk_tokens * self._prefill
            k = max(1, math.ceil((now - seg.compute_start) / chunk_s - 1e-9)) if chunk_s else 0
            end_at = seg.compute_start + k * chunk_s
            done = k * self.cost.prefill_chunk_tokens
            if end_at < seg.first_at and done < seg.prefill_todo:
                count, prefilled = 0, seg.prefilled - seg.prefill_todo + done
            else:
                end_at, count, prefilled = seg.first_at, 1, seg.prefilled
        else:
            count = min(seg.limit, seg.emitted(now, self._decode) + 1)
            end_at, prefilled = seg.first_at + (count - 1) * self._decode, seg.prefilled
        if end_at < seg.end_at or (end_at == seg.end_at and count <= seg.end_count):
            seg.end_at, seg.end_count, seg.prefilled = end_at, count, prefilled

    def _runner_next(self) -> float:
        seg = self._seg
        if seg is None:
            return math.inf
        return seg.end_at if seg.started else seg.compute_start

    def _runner_step(self) -> None:
        seg = self._seg
        if seg is None:
            return
        if not seg.started and self.now >= seg.compute_start:
            seg.started = True
            self.policy.on_started(seg.job_id, self.result.jobs[seg.job_id].prompt_tokens)
        if seg.started and self.now >= seg.end_at:
            self._finish_segment(seg)

    def _report_progress(self) -> None:
        seg = self._seg
        if seg is None or not seg.started:
            return
        emitted = seg.emitted(self.now, self._decode)
        seconds = max(0.0, self.now - seg.last_report)
        if emitted > seg.reported or seconds > 0:
            self._tokens(seg, emitted, self.now)

    def _tokens(self, seg: _Segment, emitted: int, at: float) -> None:
        record = self.result.jobs[seg.job_id]
        new = emitted - seg.reported
        if new > 0 and record.first_token is None:
            record.first_token = seg.first_at
        record.tokens += new
        seconds = max(0.0, at - seg.last_report)
        self.result.flow_runner_s[record.flow] = (
            self.result.flow_runner_s.get(record.flow, 0.0) + seconds)
        self.policy.on_tokens(seg.job_id, new, seconds)
        seg.reported, seg.last_report = emitted, at

    def _finish_segment(self, seg: _Segment) -> None:
        self._tokens(seg, seg.end_count, self.now)
        self._seg = None
        record = self.result.jobs[seg.job_id]
        record.prefilled = seg.prefilled
        if seg.stop == "cancel":
            self.timeline.run_ended(seg.job_id, "cancelled", record.tokens, self.now,
                                    waits_again=False)
            self.policy.on_cancelled(seg.job_id, 0.0)
            self._ended(seg.job_id, "cancelled")
        elif record.tokens >= record.target:
            self.timeline.run_ended(seg.job_id, "done", record.tokens, self.now,
                                    waits_again=False)
            self.policy.on_finished(seg.job_id, 0.0)
            self._ended(seg.job_id, "done")
        else:
            record.pauses += 1
            self.result.preemptions += 1
            reason = "budget" if seg.stop is None else seg.reason
            outcome = self.policy.on_paused(seg.job_id, 0.0, reason)
            self.timeline.run_ended(seg.job_id, reason, record.tokens, self.now,
                                    waits_again=outcome in (ReportOutcome.REQUEUED,
                                                            ReportOutcome.HELD))
            if outcome in (ReportOutcome.CHAT_INTERRUPTED, ReportOutcome.FAILED):
                self._ended(seg.job_id, "failed")
            elif outcome is ReportOutcome.CANCELLED:
                self._ended(seg.job_id, "cancelled")

    def _ended(self, job_id: str, outcome: str) -> None:
        record = self.result.jobs[job_id]
        record.end, record.outcome = self.now, outcome


# --- the summary -----------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100), or ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def summarize(result: SimResult) -> dict[str, Any]:
    """The ``--json`` object of ``uniun-runtime simulate`` (docs/scheduling.md, "The trace
    simulator")."""
    by_kind: dict[str, list[JobRecord]] = {}
    for record in result.jobs.values():
        by_kind.setdefault(record.kind, []).append(record)
    kinds = {}
    for kind in sorted(by_kind):
        records = by_kind[kind]
        waits = [r.first_start - r.submit for r in records if r.first_start is not None]
        ttfts = [r.first_token - r.submit for r in records if r.first_token is not None]
        done = [r.end - r.submit for r in records
                if r.outcome == "done" and r.end is not None]
        kinds[kind] = {
            "count": len(records),
            "wait_p50_s": _round(percentile(waits, 50)),
            "wait_p99_s": _round(percentile(waits, 99)),
            "ttft_p50_s": _round(percentile(ttfts, 50)),
            "ttft_p99_s": _round(percentile(ttfts, 99)),
            "completion_p50_s": _round(percentile(done, 50)),
        }
    total = sum(result.flow_runner_s.values())
    flows = {flow: {"runner_s": round(seconds, 3),
                    "share": round(seconds / total, 4) if total > 0 else 0.0}
             for flow, seconds in sorted(result.flow_runner_s.items())}
    lost = sum(1 for r in result.jobs.values() if r.outcome not in ("done", "cancelled"))
    return {"policy": result.policy, "kinds": kinds, "flows": flows,
            "swaps": result.swaps, "preemptions": result.preemptions, "lost": lost}


def simulate(policy_name: str, events: list[TraceEvent], cost: CostModel | None = None,
             *, config: PolicyConfig | None = None,
             default_model: str = "smollm2-135m-instruct") -> dict[str, Any]:
    """Run a trace and return the summary object."""
    sim = Simulation(policy_name, events, cost, config=config, default_model=default_model)
    return summarize(sim.run())


def format_table(summary: dict[str, Any]) -> str:
    """The summary as a readable plain-text table."""
    def cell(value: Any) -> str:
        return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)

    head = ("kind", "count", "wait p50", "wait p99", "ttft p50", "ttft p99", "done p50")
    rows = [head] + [
        (kind, cell(s["count"]), cell(s["wait_p50_s"]), cell(s["wait_p99_s"]),
         cell(s["ttft_p50_s"]), cell(s["ttft_p99_s"]), cell(s["completion_p50_s"]))
        for kind, s in summary["kinds"].items()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [f"policy: {summary['policy']}   (times in seconds)"]
    for n, row in enumerate(rows):
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("flow runner time:")
    for flow, s in summary["flows"].items():
        lines.append(f"  {flow:<20} {s['runner_s']:>10.1f} s  {100 * s['share']:5.1f} %")
    lines.append(f"swaps: {summary['swaps']}   preemptions: {summary['preemptions']}   "
                 f"lost: {summary['lost']}")
    return "\n".join(lines)
