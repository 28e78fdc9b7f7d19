"""What observability costs: chat TTFT and decode speed with metrics and segments on/off.

Two runtimes run side by side on the same model: one as shipped (``[metrics] enabled``
and ``[trace] segments``, the default), one with both off. Chats go to them in
interleaved pairs (on, off, then off, on, ...), so drift in the machine's load falls on
both alike; only one of them works at a time. Per chat: client-side TTFT (submit sent ->
first token) and decode speed (tokens after the first / seconds from first to last
token, client side). Also the scheduler process's CPU time per generated token, read
from ``/proc`` around each chat: that one barely depends on other load, so on a noisy
machine it is the steadier sign of what recording adds.

Goal (issue 12): TTFT and decode speed "on" within 2 % of "off". The JSON says
``ttft_ratio`` (on / off, medians), ``decode_ratio`` and whether each is within 2 %.
"""

from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from uniun.protocol import messages as m
from uniun.protocol.client import JobFailed
from uniun.runtime.bench.e2e import BenchRuntime, Log
from uniun.runtime.proc_stats import read_proc
from uniun.runtime.state import read_state

OFF = "[metrics]\nenabled = false\n[trace]\nsegments = false\n"
CHAT = [{"role": "user", "content": "Write a long story about a fox who learns to sail. "
                                    "Tell every day of the voyage."}]
GOAL = 0.02


def _chat(rt: BenchRuntime, tokens: int) -> tuple[float, float | None, float, int]:
    """(TTFT s, decode tokens/s, scheduler CPU s, tokens) of one chat on ``rt``."""
    pid = (read_state(rt.run_dir) or {}).get("children", {}).get("scheduler")
    cpu0 = read_proc(pid)[0] if isinstance(pid, int) and read_proc(pid) else 0.0
    arrivals: list[float] = []
    with rt.client() as client:
        sent = time.monotonic()
        stream = client.submit({"job_id": f"oh-{uuid.uuid4().hex[:10]}", "kind": "chat",
                                "messages": CHAT, "max_new_tokens": tokens})
        for event in stream:
            if event["type"] == m.TOKEN:
                arrivals.append(time.monotonic())
            elif event["type"] == m.ERROR:
                raise JobFailed.from_msg(event)
    got = read_proc(pid) if isinstance(pid, int) else None
    cpu = (got[0] - cpu0) if got else 0.0
    if not arrivals:
        raise RuntimeError("a benchmark chat produced no token")
    decode = ((len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
              if len(arrivals) > 2 and arrivals[-1] > arrivals[0] else None)
    return arrivals[0] - sent, decode, cpu, len(arrivals)


def run(*, model: str, base: Path, reps: int = 20, tokens: int = 64,
        log: Log = lambda _m: None) -> dict[str, Any]:
    samples: dict[str, dict[str, list[float]]] = {
        side: {"ttft_s": [], "decode_tok_s": []} for side in ("on", "off")}
    cpu = {"on": 0.0, "off": 0.0}
    tokens_of = {"on": 0, "off": 0}
    log(f"observability overhead: {reps} interleaved chat pairs of {tokens} tokens")
    with BenchRuntime(base / "obs-on", policy="uniun", model=model, log=log) as on, \
            BenchRuntime(base / "obs-off", policy="uniun", model=model, log=log,
                         extra_config=OFF) as off:
        runtimes = {"on": on, "off": off}
        for side in ("on", "off"):  # warm-up: sessions, caches, first allocations
            _chat(runtimes[side], tokens)
        for i in range(reps):
            for side in (("on", "off") if i % 2 == 0 else ("off", "on")):
                ttft, decode, used, n = _chat(runtimes[side], tokens)
                samples[side]["ttft_s"].append(ttft)
                if decode is not None:
                    samples[side]["decode_tok_s"].append(decode)
                cpu[side] += used
                tokens_of[side] += n
    med: dict[str, dict[str, float | None]] = {
        side: {k: (statistics.median(v) if v else None) for k, v in s.items()}
        for side, s in samples.items()}
    for side in ("on", "off"):  # summed: /proc counts CPU in 10 ms ticks
        med[side]["sched_cpu_ms_per_token"] = 1000 * cpu[side] / max(1, tokens_of[side])
    out: dict[str, Any] = {"reps": reps, "tokens": tokens, "on": med["on"], "off": med["off"],
                           "samples": samples, "core": core_cost()}
    for key, name in (("ttft_s", "ttft_ratio"), ("decode_tok_s", "decode_ratio"),
                      ("sched_cpu_ms_per_token", "sched_cpu_ratio")):
        a, b = med["on"][key], med["off"][key]
        out[name] = a / b if a is not None and b else None
    ttft, decode = out["ttft_ratio"], out["decode_ratio"]
    out["ttft_within_2pct"] = ttft is not None and ttft <= 1 + GOAL
    out["decode_within_2pct"] = decode is not None and decode >= 1 - GOAL
    log(f"  TTFT on/off {ttft:.3f}x, decode on/off {decode:.3f}x, scheduler CPU per token "
        f"on/off {out['sched_cpu_ratio']:.3f}x" if ttft and decode and out["sched_cpu_ratio"]
        else "  overhead: incomplete samples")
    return out


def core_cost(tokens: int = 4000, blocks: int = 6) -> dict[str, Any]:
    """CPU microseconds the scheduler spends per streamed token, recording on vs off.

    The real :class:`SchedulerCore` and :class:`Journal` (a temporary SQLite file) and a
    :class:`MetricSink`, driven by ``Token`` reports the way the host drives them: core,
    pump, journal commit, observations. Blocks alternate on/off and the medians are
    compared, in process CPU time, so the figure hardly moves with other load. Divided
    by a decode step (~10 ms for SmolLM2 on 2 cores) it bounds what recording can add
    to decode speed.
    """
    import tempfile

    from uniun.actors.metrics import MetricSink
    from uniun.actors.policy import make_policy
    from uniun.actors.scheduler.core import SchedulerCore
    from uniun.actors.scheduler.journal import Journal
    from uniun.protocol import requests as rq
    from uniun.protocol import runner_records as rp
    from uniun.protocol.jobmap import validate_job

    def block(on: bool, folder: Path, n: int) -> float:
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
        spec = validate_job({"job_id": "c", "kind": "chat", "prompt": "x",
                             "max_new_tokens": n + 1}, default_model="m")
        apply(core.request(b"conn", rq.Submit("s", spec)))
        apply(core.pump())
        apply(core.report(rp.Started(job_id="c", resumed=False, prompt_tokens=3,
                                     recomputed=0, seed=1)))
        started = time.process_time()
        for seq in range(n):
            apply(core.report(rp.Token(job_id="c", seq=seq, token_id=seq, text="t",
                                       seconds=0.01)))
            apply(core.pump())
        used = time.process_time() - started
        journal.close()
        return 1e6 * used / n

    runs: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="uniun-core-cost-") as tmp:
        for i in range(blocks):
            for side in (("on", "off") if i % 2 == 0 else ("off", "on")):
                runs[side].append(block(side == "on", Path(tmp), tokens))
    on, off = statistics.median(runs["on"]), statistics.median(runs["off"])
    return {"tokens_per_block": tokens, "blocks": blocks, "us_per_token_on": on,
            "us_per_token_off": off, "added_us_per_token": on - off,
            "added_share_of_10ms_step": (on - off) / 10_000.0, "samples": runs}
