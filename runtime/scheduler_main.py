"""Entry point of the scheduler process: ``main(config) -> int``.

The supervisor starts it through ``python -m uniun.runtime.process scheduler`` (logging,
supervisor heartbeat and SIGTERM handling are set up there). This function builds the
three actors of docs/scheduler-runner.md and wires them:

  clients --DEALER--> [front ROUTER] FrontActor --tell--> SchedulerHost --tell--> RunnerLink
                                       ^                     |   ^                 |
                                       +------ Outgoing -----+   +-- reports ------+
                                                                  [runner ROUTER] <--DEALER-- runner

Start order matters: the journal is replayed into the host *before* either socket is
bound, so the first request or runner Hello already sees every acknowledged job. A
corrupt journal is moved aside first (:func:`open_journal`), so it costs its own jobs,
not the runtime.

Stop: the front answers ``shutting_down`` from the first moment; the host parks the
running job (its progress is exact in the journal and the runner keeps the snapshot for
the next scheduler); after at most ``stop_grace_s / 2`` the actors stop and the process
exits 0. Any actor's death is the process's death (exit 1; the supervisor restarts it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pykka
import zmq
from loguru import logger

from uniun.actors.metrics import MetricSink
from uniun.actors.scheduler.core import SchedulerCore
from uniun.actors.scheduler.crash_marker import CRASH_MARKER_FILE, CrashMarker
from uniun.actors.scheduler.device_signal import DevicePublisher
from uniun.actors.scheduler.front import FrontActor
from uniun.actors.scheduler.front_messages import OpenFront, Stopping
from uniun.actors.scheduler.host import (
    Drain,
    PowerRead,
    Quiet,
    Replay,
    RunnerLane,
    SchedulerHost,
    Wire,
)
from uniun.actors.scheduler.inbox_order import Interactive
from uniun.actors.scheduler.journal import Journal, JournalEntry
from uniun.actors.scheduler.model_ids import ModelIds
from uniun.actors.scheduler.power_reader import PowerWatch
from uniun.actors.scheduler.runner_link import OpenLink, RunnerLinkActor
from uniun.models.grammar_sandbox import GrammarSandbox
from uniun.models.store import ModelStore
from uniun.protocol import runner_records as rp
from uniun.protocol.codec import Limits
from uniun.protocol.device_state import device_endpoint
from uniun.protocol.endpoints import default_endpoint
from uniun.protocol.requests import JobRules
from uniun.runtime.config import RuntimeConfig
from uniun.runtime.paths import ensure_private_dir, models_dir, run_dir, uniun_home
from uniun.runtime.proc_stats import ProcessSampler
from uniun.runtime.quarantine import read_records
from uniun.runtime.security import server_security

__all__ = ["VALIDATE_CRASH_ENV", "main", "journal_path", "validate_crash_hook"]

DRAIN_MIN_S = 1.0  # seconds the front keeps answering shutting_down while stopping
SWITCH_INTERVAL_S = 0.001  # the interpreter's thread switch interval here (default 0.005)
# Test fault hook: a scheduler started with this variable set kills itself (SIGKILL, as a
# stack overflow in native code would) while it validates a submit whose schema (format
# or tools) contains the value. Only test runtimes set it; it is not a config key.
VALIDATE_CRASH_ENV = "UNIUN_TEST_VALIDATE_CRASH"


def journal_path() -> Path:
    return uniun_home() / "journal.db"


def _processes(state: dict | None = None) -> dict[str, int]:
    """Children's pids as the supervisor published them (empty when run by hand)."""
    from uniun.actors.embedding.workers import read_pids
    from uniun.runtime.state import read_state

    state = state if state is not None else read_state(run_dir()) or {}
    children = state.get("children") or {}
    processes = {name: pid for name, pid in children.items() if isinstance(pid, int)}
    processes.update(read_pids(run_dir()))  # the embed pool's own embed-N workers
    processes["scheduler"] = os.getpid()
    return processes


def _process_info(sampler: ProcessSampler) -> dict[str, dict]:
    """pid, CPU %, RSS and restarts of every process, for ``status.process_info``."""
    from uniun.runtime.device import describe
    from uniun.runtime.state import read_state

    state = read_state(run_dir()) or {}
    restarts = {k: v for k, v in (state.get("restarts") or {}).items() if isinstance(v, int)}
    info = sampler.sample(_processes(state), restarts)
    for entry in info.values():  # SCHED_IDLE / nice N / normal (docs/device.md)
        entry["priority"] = describe(entry["pid"])
    return info


def main(config: RuntimeConfig) -> int:
    from uniun.actors.policy import make_policy
    from uniun.runtime import process

    ensure_private_dir(run_dir())
    # The actors share one interpreter lock; a thread that has work (the runner link
    # with a chat's first token) waits for a busy one to reach the switch interval.
    # 1 ms instead of Python's 5: a chat's first token does not wait out a busy thread's
    # slice (docs/device.md; `python -m uniun.runtime.bench.burst` measures it).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    stop = threading.Event()
    process.on_stop(stop.set)
    clock = time.monotonic
    policy = make_policy(config.policy.name, config.policy.policy_config(), clock)
    journal, replayed = open_journal(config)
    # Clients' schemas compile in a child process: a crash there refuses one request
    # (models/grammar_sandbox.py), here it would stop every client's work.
    store = ModelStore(models_dir())
    grammar = GrammarSandbox(timeout_s=config.limits.schema_compile_timeout_s,
                             model_folder=store.folder)
    grammar.start_in_background(warm_model=config.models.chat_model)  # the front binds now
    rules = JobRules(default_model=config.models.chat_model, kinds=tuple(config.jobs.kinds),
                     max_new_tokens_cap=config.limits.max_new_tokens_cap,
                     max_prompt_chars=config.limits.max_prompt_chars,
                     known_models=ModelIds(store),
                     check_format=grammar.check)  # a schema that cannot compile is refused here
    if crash_text := os.environ.get(VALIDATE_CRASH_ENV):
        rules = validate_crash_hook(rules, crash_text)
    ctx = zmq.Context()
    sampler = ProcessSampler()
    core = SchedulerCore(policy=policy, queue_cap=config.limits.queue_cap,
                         chat_reserve_share=config.limits.chat_reserve_share,
                         client_share=config.limits.client_share, clock=clock,
                         wall=time.time, processes=_processes,
                         process_info=lambda: _process_info(sampler),
                         segments=config.trace.segments, metrics=config.metrics.enabled,
                         quarantined=read_records(run_dir()),
                         dead_letters=journal.dead_letters())
    sink = MetricSink() if config.metrics.enabled else None
    publisher = None
    if config.device.yield_signal:  # docs/device.md: the one-way yield signal
        publisher = DevicePublisher(device_endpoint(), ctx)
        publisher.start()
    lane = RunnerLane()  # runner reports skip the queue of client batches
    host = SchedulerHost.start(core=core, journal=journal, clock=clock,
                               observe=sink.apply if sink is not None else None, lane=lane,
                               device=publisher.set if publisher is not None else None)
    watch = None
    if config.device.power_watch:  # docs/device.md, "Power and heat"
        watch = PowerWatch(Path(config.device.sysfs_root),
                           lambda state: host.tell(PowerRead(state)),
                           poll_s=config.device.power_poll_s)
    pcfg = policy.config
    endpoint = config.front.endpoint or default_endpoint()
    security = server_security(endpoint, "front")  # CURVE on tcp; refuses an open tcp front
    # Before the front serves: a request the last scheduler died validating is counted.
    crash_marker = CrashMarker.open(run_dir() / CRASH_MARKER_FILE)
    front = FrontActor.start(endpoint=endpoint, host=host,
                             rules=rules, limits=Limits(frame_bytes=config.limits.max_frame_bytes),
                             linger_ms=config.front.linger_ms, ctx=ctx,
                             interactive=Interactive(pcfg.chat_kind, None, pcfg.extract_kind),
                             socket_setup=security,
                             conn_pending_cap=config.front.conn_pending_cap,
                             pending_cap=config.front.pending_cap, crash_marker=crash_marker)
    link = RunnerLinkActor.start(host=lane, endpoint=rp.runner_endpoint(),
                                 liveness=config.supervisor.liveness, ctx=ctx)
    actors = (front, link, host)
    rc = 0
    try:
        host.tell(Wire(front=front, link=link))
        host.tell(Replay(replayed))
        if watch is not None:
            watch.start()  # after Wire: its first reading may lead to marks
        link.tell(OpenLink())
        bound = front.ask(OpenFront(), timeout=30)
        logger.info("scheduler serving on {} with policy {}", bound, config.policy.name)
        while not stop.wait(0.5) and not process.STOPPING.is_set():
            if not all(a.is_alive() for a in actors):
                logger.error("an actor died; exiting so the supervisor restarts the scheduler")
                rc = 1
                break
        if rc == 0:
            _drain(front, host, grace_s=max(DRAIN_MIN_S, config.supervisor.stop_grace_s / 2))
    except pykka.ActorDeadError:
        logger.exception("an actor died during start-up")
        rc = 1
    finally:
        if watch is not None:
            watch.stop()
        pykka.ActorRegistry.stop_all(timeout=5)
        if publisher is not None:
            publisher.close()
        if security is not None:
            security.stop()
        journal.close()
        grammar.close()
        ctx.destroy(linger=0)
    return rc


def validate_crash_hook(rules: JobRules, text: str) -> JobRules:
    """``rules`` whose schema check first dies on ``text`` (:data:`VALIDATE_CRASH_ENV`)."""
    check = rules.check_format

    def checked(fmt: dict[str, Any], model_id: str) -> None:
        if text in json.dumps(fmt):
            logger.error("test crash text in a schema under validation; dying")
            os.kill(os.getpid(), signal.SIGKILL)
        if check is not None:
            check(fmt, model_id)
    return dataclasses.replace(rules, check_format=checked)


def open_journal(config: RuntimeConfig) -> tuple[Journal, list[JournalEntry]]:
    """The journal, opened and replayed; a corrupt one is moved aside first.

    ``PRAGMA quick_check`` before opening, and a corruption error while replaying, both
    move the file (and its -wal/-shm) to ``journal.db.corrupt-<time>`` and start a new
    one: the jobs in a damaged journal are lost either way, and every job after it is
    not (runtime/quarantine.py). What this runtime moved aside goes into ``status``
    (``read_records``).
    """
    from uniun.runtime.quarantine import is_corruption, moved_aside, quarantine_if_corrupt

    path = journal_path()
    quarantine_if_corrupt(path, run_dir())

    def opened() -> tuple[Journal, list[JournalEntry]]:
        journal = Journal(path, keep_segments=config.trace.keep_segments,
                          synchronous=config.journal.synchronous)
        try:
            return journal, journal.replay(
                default_model=config.models.chat_model, kinds=tuple(config.jobs.kinds),
                max_new_tokens_cap=config.limits.max_new_tokens_cap)
        except BaseException:
            journal.close()
            raise

    try:
        result = opened()
    except sqlite3.DatabaseError as err:
        if not is_corruption(err):
            raise
        moved_aside(path, str(err), run_dir())
        result = opened()
    return result


def _drain(front: pykka.ActorRef, host: pykka.ActorRef, *, grace_s: float) -> None:
    """Answer shutting_down, park the running job, give it up to ``grace_s``."""
    front.tell(Stopping())
    host.tell(Drain())
    started = time.monotonic()
    deadline = started + grace_s
    while time.monotonic() < deadline:
        try:
            if host.ask(Quiet(), timeout=1.0) and time.monotonic() - started >= DRAIN_MIN_S:
                break
        except (pykka.Timeout, pykka.ActorDeadError):
            break
        time.sleep(0.05)
    logger.info("drained in {:.2f} s", time.monotonic() - started)
