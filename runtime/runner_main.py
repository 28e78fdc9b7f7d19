"""Entry point of the runner process: ``main(config) -> int``.

The supervisor starts it through ``python -m uniun.runtime.process runner``, which has
already set up logging, the supervisor heartbeat and SIGTERM handling. This function
wires the one actor that does the work (:class:`~uniun.actors.runner.worker.RunnerWorker`,
which owns the decoder session, the parked snapshots and the socket to the scheduler)
and waits until it is told to stop or the actor dies. An actor's death is the process's
death (docs/style.md §2): the supervisor restarts the process and the scheduler tells the
new runner what was in flight.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
from loguru import logger

from uniun.actors.runner.pacing import Pacing
from uniun.actors.runner.worker import RunnerWorker
from uniun.models.parking import DEFAULT_PARKING_BYTES, DEFAULT_SPILL_BYTES, ParkingLot
from uniun.models.snapshot_budget import (
    AUTO,
    free_disk,
    kv_bytes_per_token,
    machine_memory,
    snapshot_caps,
)
from uniun.models.store import ModelStore
from uniun.protocol import runner_records as rp
from uniun.runtime import process
from uniun.runtime.config import RuntimeConfig
from uniun.runtime.config_sections import MIB
from uniun.runtime.paths import ensure_private_dir, models_dir, run_dir

__all__ = [
    "CRASH_MARKER_ENV",
    "LOAD_HOLD_ENV",
    "PASS_PACE_ENV",
    "TOKEN_PACE_ENV",
    "crash_hook",
    "hold_gil",
    "load_hold_hook",
    "main",
    "parking_sizer",
    "spill_dir",
    "token_pace",
]

# Test fault hook: a runner started with this variable set kills itself (SIGKILL, as a
# segfault in native code would) when a job whose input contains the value starts. Only
# test runtimes set it (tests/, `uniun-runtime chaos`); it is not a config key on purpose.
CRASH_MARKER_ENV = "UNIUN_TEST_CRASH_MARKER"
# Test hook: every model load first holds the GIL this many seconds, as loading Gemma 3's
# tokenizer does, so a test can check that the runner is not restarted mid-load.
LOAD_HOLD_ENV = "UNIUN_TEST_LOAD_HOLD_S"
# Test hook: the runner makes at most one token per this many seconds (it sleeps before
# reporting a token that came early), so a test's long job outlasts a slice, a deadline
# or a chat however fast the machine is: its length is at least its token count times
# this pace, not a hope that the model is slow. The test harness sets it for every
# runtime it starts.
TOKEN_PACE_ENV = "UNIUN_TEST_TOKEN_PACE_S"
# Test hook: a prompt pass of n positions takes at least n times this many seconds (the
# runner waits after it, cut short when a command preempts the job), so a test's long
# prefill outlasts the chat sent during it however fast the machine prefills.
PASS_PACE_ENV = "UNIUN_TEST_PASS_PACE_S"


def spill_dir(config: RuntimeConfig) -> Path:
    """Where parked snapshots spill: ``[runner] spill_dir``, default ``$UNIUN_HOME/run/spill``."""
    return Path(config.runner.spill_dir) if config.runner.spill_dir else run_dir() / "spill"


def _preload_model(config: RuntimeConfig, store: ModelStore) -> str | None:
    """The chat model, if the store has it already (the runner never converts at boot)."""
    try:
        model = config.models.chat_model
        return model if store.has(model) else None
    except Exception:  # noqa: BLE001 - a broken store must not stop the runner; loads will report it
        return None


def crash_hook(marker: str) -> Callable[[rp.Start], None]:
    """The ``before_start`` hook of :data:`CRASH_MARKER_ENV`: die on a marked job."""
    def check(cmd: rp.Start) -> None:
        text = (cmd.prompt or "") + "".join(m[1] for m in cmd.messages or ())
        if marker in text:
            logger.bind(job=cmd.job_id).error("test crash marker in the input; dying")
            os.kill(os.getpid(), signal.SIGKILL)
    return check


def hold_gil(seconds: float) -> None:
    """Hold the GIL for at least about ``seconds`` in one C call, as tokenizers does while
    it parses a large ``tokenizer.json`` (the :data:`LOAD_HOLD_ENV` test hook).

    The speed is the fastest of five short samples: one sample taken while the process was
    descheduled (a loaded 2-core machine) measured the speed 3x too low, and the hold came
    out shorter than the supervisor's silence limit. A fast estimate errs the safe way: on
    a busy machine the hold is longer, never shorter.
    """
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        sum(range(1_000_000))  # builtins over a range run in C: no bytecode, no GIL release
        best = min(best, time.perf_counter() - t0)
    sum(range(int(1_000_000 / max(best, 1e-6) * seconds)))


def load_hold_hook(seconds: float) -> Callable[[], None]:
    """The ``before_load`` hook of :data:`LOAD_HOLD_ENV`."""
    def hold() -> None:
        logger.warning("test hook: holding the GIL for {:g} s, as a slow model load", seconds)
        hold_gil(seconds)
    return hold


def token_pace(value: str | None, env: str = TOKEN_PACE_ENV, what: str = "token") -> float:
    """Seconds per token of :data:`TOKEN_PACE_ENV` (or per prompt position of
    :data:`PASS_PACE_ENV`); 0: unset; a bad value is logged, 0."""
    if not value:
        return 0.0
    try:
        pace = float(value)
    except ValueError:
        pace = -1.0
    if not 0.0 <= pace <= 10.0:
        logger.warning("{}={!r} is not seconds in [0, 10]; no {} pace", env, value, what)
        return 0.0
    logger.warning("test hook: at most one {} per {:g} s", what, pace)
    return pace


def parking_sizer(config: RuntimeConfig, spill: Path) -> Callable[[Any, ParkingLot], None]:
    """Sets the parking's caps for each model loaded: from its KV bytes per position and
    the machine's memory and disk now, unless the configuration gives bytes
    (models/snapshot_budget.py, docs/kv-cache.md)."""
    r = config.runner

    def size(session: Any, lot: ParkingLot) -> None:
        bpt = int(getattr(session, "kv_bytes_per_token", 0)) or kv_bytes_per_token(
            getattr(session, "config", {}))
        caps = snapshot_caps(
            kv_bytes_per_token=bpt, memory=machine_memory(), disk_free=free_disk(spill),
            positions=r.snapshot_positions, memory_share=r.snapshot_memory_share,
            spill_positions=r.spill_positions, memory_cap=r.snapshot_cap_bytes,
            disk_cap=r.spill_cap_bytes, fallback_memory=DEFAULT_PARKING_BYTES,
            fallback_disk=DEFAULT_SPILL_BYTES)
        lot.max_bytes, lot.max_disk_bytes = caps.memory_bytes, caps.disk_bytes
        logger.info("parked KV of {}: {:.0f} MiB in memory ({}), {:.0f} MiB on disk ({})",
                    getattr(session, "model_id", "?"), caps.memory_bytes / MIB,
                    caps.memory_rule, caps.disk_bytes / MIB, caps.disk_rule)
        lot.enforce()
    return size


def main(config: RuntimeConfig) -> int:
    ensure_private_dir(run_dir())
    spill = ensure_private_dir(spill_dir(config))
    stop = threading.Event()
    process.on_stop(stop.set)
    ctx = zmq.Context()
    r = config.runner
    # Until a model is loaded its KV size is unknown: the fallback caps (or the configured).
    lot = ParkingLot(r.snapshot_cap_bytes if r.snapshot_cap_bytes != AUTO
                     else DEFAULT_PARKING_BYTES,
                     max_disk_bytes=r.spill_cap_bytes if r.spill_cap_bytes != AUTO
                     else DEFAULT_SPILL_BYTES, spill_dir=spill, kv_dtype=r.parked_kv_dtype)
    store = ModelStore(models_dir())
    budget = config.budget()  # docs/device.md: chosen with the other sessions' threads
    logger.info("ONNX Runtime threads: runner {} (spinning {}), each embed worker {}, "
                "background-Gana {}", budget.runner_threads, budget.runner_spinning,
                budget.embed_threads, budget.background_threads)
    worker = RunnerWorker.start(
        ctx=ctx, endpoint=rp.runner_endpoint(), liveness=config.supervisor.liveness,
        store=store, threads=budget.runner_threads, parking=lot, spill_dir=spill,
        preload=_preload_model(config, store), spinning=budget.runner_spinning,
        before_start=crash_hook(marker) if (marker := os.environ.get(CRASH_MARKER_ENV))
        else None, load_grace_s=config.supervisor.load_grace_s,
        announce_quiet=process.announce_quiet,
        before_load=load_hold_hook(float(hold)) if (hold := os.environ.get(LOAD_HOLD_ENV))
        else None, pacing=Pacing(
            target_s=r.pass_target_ms / 1000.0, chunk_min=r.prefill_chunk_min,
            chunk_max=r.prefill_chunk_max,
            token_pace_s=token_pace(os.environ.get(TOKEN_PACE_ENV)),
            pass_pace_s=token_pace(os.environ.get(PASS_PACE_ENV), PASS_PACE_ENV,
                                   "prompt position")),
        size_parking=parking_sizer(config, spill))
    rc = 0
    try:
        while not stop.wait(0.5) and not process.STOPPING.is_set():
            if not worker.is_alive():
                logger.error("the worker actor died; exiting so the supervisor restarts us")
                rc = 1
                break
    finally:
        if worker.is_alive():
            worker.stop(timeout=5)
        ctx.destroy(linger=0)
    return rc
