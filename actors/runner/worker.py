"""The runner's worker actor: the socket, the heartbeats and the inbox the model work runs in.

Theory of operation. One pykka actor does all model work, one pass per message: a
``_Step`` handler decodes ONE token (or feeds one time-bounded pass of a long prompt),
reports it, and tells itself the next ``_Step``. Commands from the scheduler arrive in
the same inbox (the socket pump tells them), and the pump thread aborts the active job's
pass in flight when a command preempts it, so a ``Pause`` takes effect at once rather than
after the pass, and the socket loop (which also sends the heartbeats) never waits for a
generation (docs/scheduler-runner.md, "Bounded passes").

This module is the plumbing around that loop: the DEALER socket and its pump, the
heartbeats and the scheduler's liveness, the ``Hello`` handshake with a (re)started
scheduler, and the dispatch of messages. What a command or a step *does* — the decoder
session, the active job, the parked ones — is :class:`~uniun.actors.runner.jobs.RunnerJobs`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka
import zmq
from loguru import logger

from uniun.actors.runner.jobs import RunnerJobs
from uniun.actors.runner.pacing import Pacing
from uniun.actors.socket_pump import Frames, Outbox, SocketPump
from uniun.models.parking import ParkingLot
from uniun.models.store import ModelStore
from uniun.protocol import runner_records as rp
from uniun.protocol.liveness import Liveness
from uniun.protocol.runner_socket import runner_socket

__all__ = ["RunnerWorker", "QUIET_SEND_S"]

QUIET_SEND_S = 0.05  # the pump thread's time to send the quiet beat before the GIL is held


@dataclass(frozen=True)
class _Cmd:
    command: rp.Command


@dataclass(frozen=True)
class _Step:
    pass


@dataclass(frozen=True)
class _Boot:
    pass


@dataclass(frozen=True)
class _Unacked:
    """The scheduler answered our beat ``seq`` without acknowledging our boot."""

    seq: int


@dataclass(frozen=True)
class _SchedulerSilent:
    """No word from the scheduler past our liveness rule: it is dead or hung."""


class RunnerWorker(pykka.ThreadingActor):
    """See the module docstring."""

    def __init__(self, *, ctx: zmq.Context, endpoint: str, liveness: Liveness,
                 store: ModelStore, threads: int, parking: ParkingLot, spill_dir: Path,
                 preload: str | None = None, spinning: bool = True,
                 before_start: Callable[[rp.Start], None] | None = None,
                 load_grace_s: float = 0.0,
                 announce_quiet: Callable[[float], None] = lambda _s: None,
                 before_load: Callable[[], None] | None = None,
                 pacing: Pacing | None = None,
                 size_parking: Callable[[Any, ParkingLot], None] | None = None) -> None:
        super().__init__()
        self._load_grace_s = load_grace_s
        self._announce_supervisor = announce_quiet  # runtime/process.announce_quiet
        self._before_load_hook = before_load  # test hook (runner_main.load_hold_hook)
        self._ctx = ctx
        self._endpoint = endpoint
        self._liveness = liveness
        self._spill_dir = spill_dir
        self._boot = rp.new_boot()
        # Set by the pump thread when a command in the inbox preempts the active job,
        # cleared when the actor takes a command: a test pace's wait ends at once.
        self._preempted = threading.Event()
        pacing = pacing or Pacing()
        pacing.sleep = self._sleep  # the paces' waits: cut short by a preemption
        self._jobs = RunnerJobs(store=store, threads=threads, parking=parking, preload=preload,
                                report=self._report, spinning=spinning,
                                step_again=lambda: self.actor_ref.tell(_Step()),
                                before_start=before_start, before_load=self._before_load,
                                pacing=pacing, size_parking=size_parking)
        self._hello_beat = -1  # beats numbered above this+1 were sent after our Hello
        self._beat_seq = 0  # pump thread increments; the actor reads it
        self._heard_at = time.monotonic()  # pump thread only: last scheduler message
        self._silent = False  # pump thread only
        self._pump: SocketPump | None = None
        self._outbox: Outbox | None = None

    # ---- lifecycle ------------------------------------------------------------------

    def on_start(self) -> None:
        identity = rp.runner_identity(self._boot)

        def make_socket(ctx: zmq.Context) -> zmq.Socket:
            sock = runner_socket(ctx, zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, identity)
            sock.connect(self._endpoint)
            return sock

        self._pump = SocketPump("runner", self._ctx, make_socket, self._on_frames,
                                tick_s=self._liveness.interval_s, on_tick=self._on_tick)
        self._pump.start()
        self._outbox = self._pump.outbox()
        self._jobs.find_orphans(self._spill_dir)
        self.actor_ref.tell(_Boot())

    def on_stop(self) -> None:
        active = self._jobs.active
        if active is not None:
            logger.bind(job=active.job_id).info("stopping with this job active; "
                                                "its scheduler will resume it elsewhere")
        if self._outbox is not None:
            self._outbox.close()
        if self._pump is not None:
            self._pump.stop()

    # ---- pump thread callbacks (must not touch actor state but the stats tuple) ------

    def _on_frames(self, frames: Frames) -> None:
        # Never earlier than an announced load's widening (_announce_quiet).
        self._heard_at = Liveness.heard(time.monotonic(), previous=self._heard_at)
        self._silent = False
        try:
            record = rp.decode(frames[-1])
        except rp.BadRecord as err:
            logger.warning("bad frame from the scheduler: {}", err)
            return
        if isinstance(record, rp.Heartbeat):
            if record.ack != self._boot:
                self.actor_ref.tell(_Unacked(record.seq))
        elif isinstance(record, rp.Command):
            self.actor_ref.tell(_Cmd(record))
            self._cut_short_for(record)

    def _cut_short_for(self, record: rp.Command) -> None:
        """A command that takes the model from the active job aborts its pass (pump thread).

        That is a pause or cancel of the active job, and a start, resume or model load
        of any other (each parks the active job first). The command is already in the
        actor's inbox, ahead of the retried step, so the actor parks the job where it was
        before the aborted pass instead of finishing a pass nobody will wait for: a chat
        waits for no background pass, prefill or decode, whatever the model's size.
        ``RunnerJobs.preempt`` checks the active job and interrupts under one lock, so
        an interrupt meant for a job never reaches the one started after it.
        """
        if self._jobs.preempt(record):
            self._preempted.set()

    def _sleep(self, seconds: float) -> None:
        """The test paces' wait (RunnerJobs): over early when a command preempts the job."""
        self._preempted.wait(seconds)

    def _on_tick(self, now: float) -> list[Frames]:
        if not self._silent and self._liveness.dead(self._heard_at, now):
            self._silent = True
            self.actor_ref.tell(_SchedulerSilent())
        self._beat_seq += 1
        return [[rp.encode(self._heartbeat())]]

    def _heartbeat(self, quiet_s: float = 0.0) -> rp.Heartbeat:
        """A beat with the parking figures of now (``quiet_s``: see _announce_quiet)."""
        count, nbytes, trimmed, spilled = self._jobs.stats
        return rp.Heartbeat(boot=self._boot, seq=self._beat_seq, snapshots=count,
                            snapshot_bytes=nbytes, trimmed=trimmed, spilled=spilled,
                            quiet_s=quiet_s)

    # ---- messages -------------------------------------------------------------------

    def on_receive(self, message: Any) -> None:
        if isinstance(message, _Step):
            self._jobs.step()
        elif isinstance(message, _Cmd):
            self._preempted.clear()
            self._jobs.handle(message.command)
        elif isinstance(message, _Unacked):
            self._on_unacked(message.seq)
        elif isinstance(message, _SchedulerSilent):
            if self._jobs.active is not None:
                # Reported like any pause: a scheduler that was only slow re-queues and
                # resumes the job; a dead one never reads it, and its successor is told
                # about the parked job in our next Hello.
                logger.warning("the scheduler is silent; parking the running job")
                self._jobs.park_active(report=True)
        elif isinstance(message, _Boot):
            self._on_boot()

    def _before_load(self) -> None:
        self._announce_quiet()
        if self._before_load_hook is not None:
            self._before_load_hook()

    def _announce_quiet(self) -> None:
        """Before a model load: say we will be silent for up to ``load_grace_s``.

        Why: loading holds the GIL for seconds (tokenizers parses ``tokenizer.json``
        without releasing it: Gemma 3's takes seconds of CPU), so neither the pump nor the
        process's heartbeat thread can beat, and both the scheduler and the supervisor
        would take us for hung and restart us mid-swap. One beat to each, carrying
        ``quiet_s``, widens their patience for that long (protocol/liveness.py); our own
        patience with the scheduler widens likewise, since we cannot hear it either.
        """
        if self._load_grace_s <= 0 or self._outbox is None:
            return
        self._outbox.send([rp.encode(self._heartbeat(self._load_grace_s))])
        self._heard_at = max(self._heard_at, time.monotonic() + self._load_grace_s)
        self._announce_supervisor(self._load_grace_s)  # waits until its beat has left
        time.sleep(QUIET_SEND_S)  # and lets the pump thread send ours

    def _report(self, report: rp.Report) -> None:
        assert self._outbox is not None
        self._outbox.send([rp.encode(report)])

    def _on_boot(self) -> None:
        self._jobs.preload_model()
        self._hello()

    def _hello(self) -> None:
        jobs = self._jobs.held()
        self._hello_beat = self._beat_seq
        model = self._jobs.model_id
        self._report(rp.Hello(boot=self._boot, pid=os.getpid(), model_id=model, jobs=jobs))
        logger.info("hello sent (model {}, {} jobs held)", model, len(jobs))

    def _on_unacked(self, seq: int) -> None:
        if seq <= self._hello_beat + 1:
            return  # a reply to a beat that left before our Hello: it is on its way
        logger.info("the scheduler does not know us (restarted?); parking and saying hello")
        self._jobs.park_active(report=False)
        self._hello()
