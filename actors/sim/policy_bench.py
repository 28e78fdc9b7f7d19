"""Benchmark: how long one ``decide()`` takes with 10,000 jobs queued (docs/design.md §7).

    .venv/bin/python -m uniun.actors.sim.policy_bench [--jobs 10000] [--rounds 2000] [--out FILE]

Two measurements, each over ``rounds`` decisions with the queue kept at ``jobs``:

- ``dispatch``: the runner is free; ``decide()`` picks and returns ``Run`` (then, untimed,
  the job finishes and a fresh one is submitted in its place);
- ``check``: a fair-pool job is running; ``decide()`` re-examines it (preemption, slice,
  budget) and answers ``Idle`` — what the scheduler does after every token report.

The queue is a realistic worst case: no chat (the pick has to go down to the fair pool),
three models, 50 Gana flows, extract backfill, deadlines pending and passed, foreground
set. Results (median, p99, max in microseconds; wall clock and thread CPU time) go to
stdout as JSON and to ``--out``.
``run_bench()`` is the function ``uniun-runtime bench`` can call.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from uniun.actors.policy import PolicyConfig, Run, make_policy
from uniun.protocol.jobmap import JobSpec

MODELS = ("smollm2-135m-instruct", "qwen2.5-0.5b-instruct", "phi-3-mini")


class _Clock:
    def __init__(self) -> None:
        self.t = 10_000.0

    def __call__(self) -> float:
        return self.t


def _job(rng: random.Random, n: int, now: float) -> JobSpec:
    roll = rng.random()
    deadline = None
    if roll < 0.4:
        kind, flow = "extract", "extract"
    elif roll < 0.6:
        kind, flow = "nataraj", "nataraj"
    else:
        kind, flow = "gana", f"gana:{rng.randrange(50)}"
        if rng.random() < 0.3:  # cron ticks: most due later, a few already late
            deadline = now + rng.uniform(-30.0, 600.0)
    return JobSpec(job_id=f"job-{n}", kind=kind, model_id=rng.choice(MODELS), prompt="p",
                   max_new_tokens=128, deadline=deadline, flow=flow,
                   foreground_hint=kind == "extract" and rng.random() < 0.01)


def _stats(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]

    return {"median_us": round(pick(0.5) * 1e6, 2), "p99_us": round(pick(0.99) * 1e6, 2),
            "max_us": round(ordered[-1] * 1e6, 2), "n": len(ordered)}


def run_bench(jobs: int = 10_000, rounds: int = 2_000, seed: int = 1) -> dict[str, Any]:
    """Measure ``decide()`` with ``jobs`` queued; return the results."""
    rng = random.Random(seed)
    clock = _Clock()
    policy = make_policy("uniun", PolicyConfig(), clock, wall_clock=clock)
    policy.on_model_loaded(MODELS[0])
    policy.set_foreground("gana")
    counter = 0
    start = time.perf_counter()
    for _ in range(jobs):
        policy.submit(_job(rng, counter, clock.t))
        counter += 1
    submit_s = (time.perf_counter() - start) / jobs
    policy.set_foreground(None)

    dispatch: list[float] = []
    check: list[float] = []
    dispatch_cpu: list[float] = []
    check_cpu: list[float] = []
    wall, cpu = time.perf_counter, time.thread_time
    gc.collect()
    for _ in range(rounds):
        clock.t += 0.05
        c0, t0 = cpu(), wall()
        decision = policy.decide()
        t1, c1 = wall(), cpu()
        dispatch.append(t1 - t0)
        dispatch_cpu.append(c1 - c0)
        assert isinstance(decision, Run), decision
        policy.on_started(decision.job_id)
        clock.t += 0.01
        policy.on_tokens(decision.job_id, 1, 0.01)
        c0, t0 = cpu(), wall()
        idle = policy.decide()
        t1, c1 = wall(), cpu()
        check.append(t1 - t0)
        check_cpu.append(c1 - c0)
        policy.on_finished(decision.job_id, 0.01)
        policy.submit(_job(rng, counter, clock.t))
        counter += 1
        del idle
    status = policy.status()
    return {
        "benchmark": "policy_decide",
        "queued_jobs": jobs,
        "rounds": rounds,
        "python": sys.version.split()[0],
        "dispatch": _stats(dispatch),
        "check": _stats(check),
        # Thread CPU time: what a decision costs when the machine is shared (the wall
        # figures above include time the OS gave to other processes).
        "dispatch_cpu": _stats(dispatch_cpu),
        "check_cpu": _stats(check_cpu),
        "submit_mean_us": round(submit_s * 1e6, 2),
        "queued_after": sum(len(v) for v in status["queues"].values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="policy_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2_000)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    result = run_bench(args.jobs, args.rounds)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
