"""One chaos run: calibrate fault-free, inject faults under load, drain, judge.

1. **Calibrate.** Every workload template runs once, before any fault, on its own
   connection: the reference texts. The embedding pool embeds every text once.
2. **Faults.** The workload keeps background jobs, a chat and embedding requests going;
   ``kills`` faults are injected, one at a time, about ``duration_s / kills`` apart
   (seeded jitter), the next only once the last one recovered.
3. **Drain.** No new jobs; every acknowledged job gets ``drain_s`` to end; the still
   open ones are attached once more (a last chance for an end we missed).
4. **Judge** (:mod:`.verdict`).

The same ``seed`` draws the same faults, targets and workload choices; timing differs
from run to run (it is a real runtime), so the outcome is a property, not a replay.
"""

from __future__ import annotations

import random
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uniun.runtime.chaos.embeds import EmbedLoad
from uniun.runtime.chaos.faults import FaultInjector
from uniun.runtime.chaos.ledger import Ledger
from uniun.runtime.chaos.own_runtime import OwnRuntime
from uniun.runtime.chaos.verdict import judge
from uniun.runtime.chaos.wire import ChaosWire
from uniun.runtime.chaos.workload import Workload, WorkloadSettings
from uniun.runtime.state import read_state

__all__ = ["ChaosOptions", "run_chaos"]

Log = Callable[[str], None]
_TICK_S = 0.05


@dataclass(frozen=True)
class ChaosOptions:
    kills: int = 10  # faults to inject
    duration_s: float = 120.0  # the fault phase's intended length
    seed: int = 1
    home: Path | None = None  # an existing runtime's home; None: start our own
    model: str = "tiny-1"  # the own runtime's chat model
    workload: WorkloadSettings = field(default_factory=WorkloadSettings)
    embeds: bool = True
    drain_s: float = 180.0
    recover_timeout_s: float = 60.0
    fuzz_frames: int = 0  # hostile frames after the faults (runtime/chaos/fuzz.py)
    extra_config: str = ""  # more TOML for the own runtime (tests: fault hooks)
    kinds: tuple[str, ...] = ()  # draw only these fault kinds (empty: every possible one)
    children: tuple[str, ...] = ()  # the own runtime runs only these (empty: every one)


def run_chaos(opts: ChaosOptions, log: Log = lambda _: None) -> dict[str, Any]:
    """Run (starting a runtime of our own unless ``opts.home``) and return the verdict."""
    if opts.home is not None:
        return _run(opts, opts.home / "run", None, log)
    with tempfile.TemporaryDirectory(prefix="uc-") as tmp:  # short: ipc paths are short
        log(f"starting a runtime of its own in {tmp} (model {opts.model})")
        with OwnRuntime(Path(tmp), opts.model, opts.extra_config, opts.children) as rt:
            return _run(opts, rt.run_dir, rt, log)


def _front(run_dir: Path) -> str:
    path = run_dir / "front.endpoint"
    return path.read_text().strip() if path.exists() else f"ipc://{run_dir / 'front.sock'}"


def _embed_endpoint(run_dir: Path) -> str:
    path = run_dir / "embed.endpoint"
    return path.read_text().strip() if path.exists() else f"ipc://{run_dir / 'embed.sock'}"


def _run(opts: ChaosOptions, run_dir: Path, own: OwnRuntime | None, log: Log) -> dict[str, Any]:
    clock = time.monotonic
    rng = random.Random(opts.seed)
    run_id = f"{opts.seed}-{uuid.uuid4().hex[:6]}"
    endpoint = _front(run_dir)
    state = read_state(run_dir) or {}
    supervisor_pid = state.get("pid")

    log("calibrating: every template once, without faults")
    references = _calibrate(endpoint, rng, opts, run_id)
    embeds = None
    if opts.embeds and "embed" in (state.get("children") or {}):
        embeds = EmbedLoad(_embed_endpoint(run_dir), rng)
        embeds.calibrate()

    ledger = Ledger()
    wire = ChaosWire(endpoint, ledger, clock)
    workload = Workload(wire, rng, opts.workload, f"{run_id}-w")
    injector = FaultInjector(run_dir, rng, workload.disconnecting_client,
                             recover_timeout_s=opts.recover_timeout_s, only=opts.kinds)
    interval = opts.duration_s / max(1, opts.kills)
    log(f"fault phase: {opts.kills} faults, about {interval:.1f} s apart (seed {opts.seed})")
    if embeds is not None:
        embeds.start()
    start = clock()
    next_at = start + interval * rng.uniform(0.5, 1.5)
    while len(injector.faults) < opts.kills or not injector.idle:
        now = clock()
        wire.pump(_TICK_S)
        workload.tick(now)
        done = injector.poll(now, wire.last_token_at)
        if done is not None:
            rec = f"{done.recovery_s:.2f} s" if done.recovery_s is not None else done.note
            log(f"  fault {len(injector.faults)}/{opts.kills} {done.kind} {done.target}: {rec}")
            next_at = max(next_at, now + interval * rng.uniform(0.5, 1.5))
        if injector.idle and len(injector.faults) < opts.kills and now >= next_at:
            fault = injector.inject(now)
            ledger.fault(fault.kind)
            if fault.recovered_at is not None:  # instantaneous (disconnect) or no target
                log(f"  fault {len(injector.faults)}/{opts.kills} {fault.kind}: {fault.note}")
                next_at = now + interval * rng.uniform(0.5, 1.5)
        if own is not None and not own.alive():
            log("the runtime exited during the fault phase")
            break
    phase_s = clock() - start

    log(f"draining: up to {opts.drain_s:g} s for {len(ledger.open_jobs())} open jobs")
    _drain(wire, ledger, opts.drain_s)
    embed_stats = embeds.finish() if embeds is not None else None
    fuzz = _fuzz(endpoint, opts, log)
    final = read_state(run_dir) or {}
    meta = {"seed": opts.seed, "kills": opts.kills, "duration_s": opts.duration_s,
            "fault_phase_s": round(phase_s, 1), "model": opts.model if own else None,
            "own_runtime": own is not None,
            "runtime_alive": final.get("pid") == supervisor_pid and final.get("state")
            == "running", "restarts": final.get("restarts"), "fuzz": fuzz,
            "workload": {"background": opts.workload.background,
                         "bg_tokens": opts.workload.bg_tokens,
                         "chat_tokens": opts.workload.chat_tokens}}
    wire.close()
    verdict = judge(ledger, injector.faults, embed_stats, references, meta=meta)
    verdict["ok"] = verdict["ok"] and bool(meta["runtime_alive"])
    return verdict


def _calibrate(endpoint: str, rng: random.Random, opts: ChaosOptions,
               run_id: str, timeout_s: float = 600.0) -> dict[str, str]:
    ledger = Ledger()
    wire = ChaosWire(endpoint, ledger, time.monotonic)
    try:
        workload = Workload(wire, random.Random(rng.random()), opts.workload, f"{run_id}-c")
        for job, template in workload.calibration():
            wire.submit(job, template)
        deadline = time.monotonic() + timeout_s
        while ledger.open_jobs() and time.monotonic() < deadline:
            wire.pump(0.2)
    finally:
        wire.close()
    refs: dict[str, str] = {}
    for hist in ledger.jobs.values():
        final = hist.final or hist.rejected or {}
        if final.get("type") != "done":
            raise RuntimeError(f"calibration job {hist.job_id} did not finish: {final}")
        refs[hist.template] = str(final["text"])
    return refs


def _drain(wire: ChaosWire, ledger: Ledger, drain_s: float) -> None:
    deadline = time.monotonic() + drain_s
    while ledger.open_jobs() and time.monotonic() < deadline:
        wire.pump(0.2)
    for hist in ledger.open_jobs():  # a last look: attach, in case an end went missing
        wire.attach(hist.job_id, hist.last_seq)
    settle = time.monotonic() + 5.0
    while ledger.open_jobs() and time.monotonic() < settle:
        wire.pump(0.2)


def _fuzz(endpoint: str, opts: ChaosOptions, log: Log) -> dict[str, Any] | None:
    """Hostile frames after the faults, if the wire fuzzer is installed (merge hook)."""
    if opts.fuzz_frames <= 0:
        return None
    try:
        from uniun.runtime.chaos import fuzz
    except ImportError:
        log("--fuzz-frames: the wire fuzzer (runtime/chaos/fuzz.py) is not part of this build")
        return {"skipped": "runtime/chaos/fuzz.py not present"}
    log(f"fuzzing the front with {opts.fuzz_frames} frames")
    report = fuzz.run_wire_fuzz(endpoint, opts.fuzz_frames, opts.seed)
    return report if isinstance(report, dict) else {"report": repr(report)}
