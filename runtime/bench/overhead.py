"""What observability costs: chat TTFT and decode speed with metrics and segments on/off.

Three runtimes run side by side on the same model: ``on`` as shipped (``[metrics]
enabled`` and ``[trace] segments``, the default), ``off`` with both off, and ``control``,
a second one with both off. Only one of them works at a time.

Why three, and why rounds. On a small shared machine a chat's TTFT varies widely from
one chat to the next, even when nothing else runs, and two *identical* runtimes can differ
by a few per cent for as long as they live (where their processes landed). A ratio of two medians
then wanders by more than the 2 % the goal is about, so the bench:

- pairs its samples: every repetition measures each runtime once, in a rotating order,
  and the ratio is taken within the repetition (drift in the machine's load falls on
  every side of a pair alike);
- measures TTFT with short chats (``ttft_chats`` (10) one-token chats per side and
  repetition, their median is the repetition's sample) and decode speed with one chat
  of ``tokens`` tokens (tokens after the first / seconds from first to last, client
  side), each runtime over one persistent client;
- starts fresh runtimes for each of ``rounds`` rounds, in a rotated start order, so no
  side keeps one placement;
- reports ``control / off`` next to ``on / off``: the same measurement between two
  runtimes that differ in nothing, i.e. this run's noise floor. Each ratio is the median
  of the paired ratios with a bootstrap 95 % interval.

Also the scheduler process's CPU time per generated token (from ``/proc``, summed), and
``core``: the scheduler core + journal + metric sink's CPU time in-process, per streamed
token and per chat start, on vs off, which hardly moves with machine load and bounds
what recording can add.

Goal (docs/design.md §7): TTFT and decode speed "on" within 2 % of "off". The JSON says
``ttft_ratio`` (on / off), ``decode_ratio`` and whether each is within 2 %.
"""

from __future__ import annotations

import random
import statistics
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from uniun.protocol import messages as m
from uniun.protocol.client import Client, JobFailed
from uniun.runtime.bench.e2e import BenchRuntime, Log
from uniun.runtime.proc_stats import read_proc
from uniun.runtime.state import read_state

OFF = "[metrics]\nenabled = false\n[trace]\nsegments = false\n"
CONFIGS = {"on": "", "off": OFF, "control": OFF}
SIDES = tuple(CONFIGS)
CHAT = [{"role": "user", "content": "Write a long story about a fox who learns to sail. "
                                    "Tell every day of the voyage."}]
GOAL = 0.02


class _Side:
    """One runtime of the comparison, with one persistent client and its scheduler pid."""

    def __init__(self, rt: BenchRuntime, client: Client) -> None:
        self.rt, self.client = rt, client
        pid = (read_state(rt.run_dir) or {}).get("children", {}).get("scheduler")
        self.pid = pid if isinstance(pid, int) else None

    def cpu(self) -> float:
        got = read_proc(self.pid) if self.pid is not None else None
        return got[0] if got else 0.0

    def chat(self, tokens: int) -> list[float]:
        """Token arrival times (monotonic s) of one chat, the send time first."""
        sent = time.monotonic()
        times = [sent]
        stream = self.client.submit({"job_id": f"oh-{uuid.uuid4().hex[:10]}", "kind": "chat",
                                     "messages": CHAT, "max_new_tokens": tokens})
        for event in stream:
            if event["type"] == m.TOKEN:
                times.append(time.monotonic())
            elif event["type"] == m.ERROR:
                raise JobFailed.from_msg(event)
        if len(times) < 2:
            raise RuntimeError("a benchmark chat produced no token")
        return times


def _rep(side: _Side, ttft_chats: int, tokens: int) -> tuple[float, float | None, float, int]:
    """(median TTFT s, decode tokens/s, scheduler CPU s, tokens) of one repetition."""
    cpu0 = side.cpu()
    ttfts = []
    for _ in range(ttft_chats):
        times = side.chat(1)
        ttfts.append(times[1] - times[0])
    times = side.chat(tokens)
    arrivals = times[1:]
    decode = ((len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
              if len(arrivals) > 2 and arrivals[-1] > arrivals[0] else None)
    return (statistics.median(ttfts), decode, side.cpu() - cpu0,
            ttft_chats + len(arrivals))


def paired_ratio(num: list[float | None], den: list[float | None],
                 resamples: int = 2000) -> dict[str, Any] | None:
    """Median of the per-repetition ratios ``num[i] / den[i]`` and a bootstrap 95 %
    interval of that median (seeded: the same samples give the same interval)."""
    ratios = [a / b for a, b in zip(num, den) if a is not None and b]
    if not ratios:
        return None
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(resamples))
    return {"median": statistics.median(ratios), "pairs": len(ratios),
            "ci95": [medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]]}


def run(*, model: str, base: Path, reps: int = 20, rounds: int = 2, ttft_chats: int = 10,
        tokens: int = 96, log: Log = lambda _m: None) -> dict[str, Any]:
    """``rounds`` x ``reps`` paired repetitions (``reps`` split over the rounds)."""
    samples: dict[str, dict[str, list[float | None]]] = {
        side: {"ttft_s": [], "decode_tok_s": []} for side in SIDES}
    cpu = {side: 0.0 for side in SIDES}
    tokens_of = {side: 0 for side in SIDES}
    per_round = max(1, -(-reps // rounds))
    log(f"observability overhead: {rounds} rounds of {per_round} repetitions; each "
        f"{ttft_chats} one-token chats and one {tokens}-token chat per runtime "
        f"({', '.join(SIDES)})")
    for r in range(rounds):
        order = SIDES[r % 3:] + SIDES[:r % 3]  # who starts first moves each round
        with ExitStack() as stack:
            sides: dict[str, _Side] = {}
            for name in order:
                rt = stack.enter_context(BenchRuntime(
                    base / f"r{r}-{name}", policy="uniun", model=model, log=log,
                    extra_config=CONFIGS[name]))
                sides[name] = _Side(rt, stack.enter_context(rt.client()))
            for name in order:  # warm-up: sessions, caches, first allocations
                _rep(sides[name], 1, tokens)
            for i in range(per_round):
                for name in order[i % 3:] + order[:i % 3]:
                    ttft, decode, used, n = _rep(sides[name], ttft_chats, tokens)
                    samples[name]["ttft_s"].append(ttft)
                    samples[name]["decode_tok_s"].append(decode)
                    cpu[name] += used
                    tokens_of[name] += n
    med: dict[str, dict[str, float | None]] = {
        side: {k: statistics.median([x for x in v if x is not None] or [float("nan")])
               for k, v in s.items()} for side, s in samples.items()}
    for side in SIDES:  # summed: /proc counts CPU in 10 ms ticks
        med[side]["sched_cpu_ms_per_token"] = 1000 * cpu[side] / max(1, tokens_of[side])
    out: dict[str, Any] = {"reps": rounds * per_round, "rounds": rounds,
                           "ttft_chats": ttft_chats, "tokens": tokens, **med,
                           "samples": samples, "core": core_cost()}
    for key, name in (("ttft_s", "ttft"), ("decode_tok_s", "decode")):
        out[name] = paired_ratio(samples["on"][key], samples["off"][key])
        out[f"{name}_noise"] = paired_ratio(samples["control"][key], samples["off"][key])
        out[f"{name}_ratio"] = (out[name] or {}).get("median")
    on_cpu, off_cpu = (med[s]["sched_cpu_ms_per_token"] for s in ("on", "off"))
    out["sched_cpu_ratio"] = on_cpu / off_cpu if on_cpu is not None and off_cpu else None
    ttft, decode = out["ttft_ratio"], out["decode_ratio"]
    out["ttft_within_2pct"] = ttft is not None and ttft <= 1 + GOAL
    out["decode_within_2pct"] = decode is not None and decode >= 1 - GOAL
    if ttft and decode:
        log(f"  on/off: TTFT {_show(out['ttft'])}, decode {_show(out['decode'])}; "
            f"control/off (noise): TTFT {_show(out['ttft_noise'])}, decode "
            f"{_show(out['decode_noise'])}; scheduler CPU per token on/off "
            f"{out['sched_cpu_ratio'] or float('nan'):.3f}x")
    else:
        log("  overhead: incomplete samples")
    return out


def _show(ratio: dict[str, Any] | None) -> str:
    if not ratio:
        return "n/a"
    low, high = ratio["ci95"]
    return f"{ratio['median']:.3f}x [{low:.3f}, {high:.3f}]"


def core_cost(jobs: int = 200, tokens: int = 20, blocks: int = 6) -> dict[str, Any]:
    """CPU microseconds the scheduler spends per chat start and per streamed token,
    recording on vs off.

    The real :class:`SchedulerCore` and :class:`Journal` (a temporary SQLite file) and a
    :class:`MetricSink`, driven the way the host drives them (core, pump, journal commit,
    observations) through ``jobs`` chats of ``tokens`` tokens each: the *start* is the
    submit, its dispatch, ``started`` and the first token (what lies on a chat's TTFT
    path in the scheduler); the *tokens* are the rest and the finish. Blocks alternate
    on/off and the medians are compared, in process CPU time, so the figures hardly
    move with other load. Divided by the TTFT and the decode step measured end to end,
    they bound what recording can add there.
    """
    import tempfile

    from uniun.actors.metrics import MetricSink
    from uniun.actors.policy import make_policy
    from uniun.actors.scheduler.core import SchedulerCore
    from uniun.actors.scheduler.journal import Journal
    from uniun.protocol import requests as rq, runner_records as rp
    from uniun.protocol.jobmap import validate_job

    def block(on: bool, folder: Path) -> tuple[float, float]:
        policy = make_policy("uniun", None, time.monotonic)
        core = SchedulerCore(policy=policy, queue_cap=100, clock=time.monotonic,
                             wall=time.time, segments=on, metrics=on)
        journal = Journal(folder / f"j-{on}-{uuid.uuid4().hex[:6]}.db")
        sink = MetricSink() if on else None

        def apply(fx: Any) -> None:
            journal.write(fx.journal)
            if sink is not None and fx.observations:
                sink.apply(fx.observations)

        apply(core.runner_up(rp.Hello(boot="b", pid=1, model_id="m", jobs={})))
        start_s = token_s = 0.0
        for j in range(jobs):
            job_id = f"c{j}"
            spec = validate_job({"job_id": job_id, "kind": "chat", "prompt": "x",
                                 "max_new_tokens": tokens}, default_model="m")
            t0 = time.process_time()
            apply(core.request(b"conn", rq.Submit(f"s{j}", spec)))
            apply(core.pump())
            apply(core.report(rp.Started(job_id=job_id, resumed=False, prompt_tokens=3,
                                         recomputed=0, seed=1)))
            apply(core.report(rp.Token(job_id=job_id, seq=0, token_id=0, text="t",
                                       seconds=0.01)))
            apply(core.pump())
            t1 = time.process_time()
            for seq in range(1, tokens):
                apply(core.report(rp.Token(job_id=job_id, seq=seq, token_id=seq, text="t",
                                           seconds=0.01)))
                apply(core.pump())
            apply(core.report(rp.Finished(job_id=job_id, finish_reason="length",
                                          prompt_tokens=3, generated=tokens, seconds=0.2)))
            apply(core.pump())
            start_s += t1 - t0
            token_s += time.process_time() - t1
        journal.close()
        return 1e6 * start_s / jobs, 1e6 * token_s / (jobs * (tokens - 1))

    runs: dict[str, dict[str, list[float]]] = {
        side: {"start": [], "token": []} for side in ("on", "off")}
    with tempfile.TemporaryDirectory(prefix="uniun-core-cost-") as tmp:
        for i in range(blocks):
            for side in (("on", "off") if i % 2 == 0 else ("off", "on")):
                start_us, token_us = block(side == "on", Path(tmp))
                runs[side]["start"].append(start_us)
                runs[side]["token"].append(token_us)
    med = {side: {k: statistics.median(v) for k, v in r.items()} for side, r in runs.items()}
    added_start = med["on"]["start"] - med["off"]["start"]
    added_token = med["on"]["token"] - med["off"]["token"]
    return {"jobs_per_block": jobs, "tokens_per_job": tokens, "blocks": blocks,
            "us_per_start_on": med["on"]["start"], "us_per_start_off": med["off"]["start"],
            "added_us_per_start": added_start,
            "added_share_of_40ms_ttft": added_start / 40_000.0,
            "us_per_token_on": med["on"]["token"], "us_per_token_off": med["off"]["token"],
            "added_us_per_token": added_token,
            "added_share_of_8ms_step": added_token / 8_000.0, "samples": runs}
