"""The runner's worker actor: owns the decoder session and the parked KV snapshots.

Theory of operation. One pykka actor does all model work, one token per message: a
``_Step`` handler decodes ONE token (or prefills one chunk of a long prompt), reports
it, and tells itself the next ``_Step``. Commands from the scheduler arrive in the same
inbox (the socket pump tells them), so a ``Pause`` or ``Cancel`` is handled right after
the step in progress: preemption takes effect within one decode step, and the socket
loop (the pump thread, which also sends the heartbeats) never waits for a generation.

State: at most one *active* job (a live ``Generation``); every other job the runner was
told about sits in the :class:`~uniun.models.parking.ParkingLot` (trim, then spill, then
drop under its byte cap; the job's progress always stays, so it can resume by recompute).
Spill files left by a previous runner process are found at start (``_orphans``) and
offered in ``Hello``, so a restarted runner can continue such a job from disk.

Every command handler is total: bad or stale commands are logged and answered, never
raised, because an exception in a ``tell`` handler would stop the actor and with it the
process.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka
import zmq
from loguru import logger

from uniun.actors.runner.reuse import already_done, continues, find_orphans, peek_progress
from uniun.models.generate import Generation
from uniun.models.kv import ParkedState, SnapshotCorrupt
from uniun.models.parking import ParkingLot
from uniun.models.session import Interrupted
from uniun.protocol import runner_records as rp
from uniun.actors.socket_pump import Frames, Outbox, SocketPump

__all__ = ["RunnerWorker", "PREFILL_CHUNK"]

PREFILL_CHUNK = 64  # prompt positions fed per message, so control is checked during a prefill


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
    """No word from the scheduler for LIVENESS intervals: it is dead or hung."""


@dataclass
class _Active:
    job_id: str
    gen: Generation
    t0: float  # when the segment's runner time was last reported (perf_counter)
    stop_at: int | None  # generated count at which the grant is spent

    def lap(self) -> float:
        """Runner seconds since the last report of this segment."""
        now = time.perf_counter()
        seconds, self.t0 = now - self.t0, now
        return seconds


class RunnerWorker(pykka.ThreadingActor):
    """See the module docstring."""

    def __init__(self, *, ctx: zmq.Context, endpoint: str, heartbeat_s: float, liveness: int,
                 threads: int, parking: ParkingLot, spill_dir: Path,
                 preload: str | None = None) -> None:
        super().__init__()
        self._ctx = ctx
        self._endpoint = endpoint
        self._heartbeat_s = heartbeat_s
        self._liveness = liveness
        self._threads = threads
        self._lot = parking
        self._spill_dir = spill_dir
        self._preload = preload
        self._boot = rp.new_boot()
        self._session: Any = None  # DecoderSession, imported lazily (onnxruntime)
        self._active: _Active | None = None
        self._orphans: dict[str, Path] = {}
        self._hello_beat = -1  # beats numbered above this+1 were sent after our Hello
        self._beat_seq = 0  # pump thread increments; the actor reads it
        self._stats = (0, 0)  # read by the pump thread for heartbeats
        self._heard_at = time.monotonic()  # pump thread only: last scheduler message
        self._silent = False  # pump thread only
        self._pump: SocketPump | None = None
        self._outbox: Outbox | None = None

    # ---- lifecycle ------------------------------------------------------------------

    def on_start(self) -> None:
        identity = rp.runner_identity(self._boot)

        def make_socket(ctx: zmq.Context) -> zmq.Socket:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, identity)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 100_000)
            sock.setsockopt(zmq.RCVHWM, 100_000)
            sock.connect(self._endpoint)
            return sock

        self._pump = SocketPump("runner", self._ctx, make_socket, self._on_frames,
                                tick_s=self._heartbeat_s, on_tick=self._on_tick)
        self._pump.start()
        self._outbox = self._pump.outbox()
        self._orphans = find_orphans(self._spill_dir)
        self.actor_ref.tell(_Boot())

    def on_stop(self) -> None:
        if self._active is not None:
            logger.bind(job=self._active.job_id).info("stopping with this job active; "
                                                       "its scheduler will resume it elsewhere")
        if self._outbox is not None:
            self._outbox.close()
        if self._pump is not None:
            self._pump.stop()

    # ---- pump thread callbacks (must not touch actor state but the stats tuple) ------

    def _on_frames(self, frames: Frames) -> None:
        self._heard_at, self._silent = time.monotonic(), False
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
        """A pause or cancel of the active job aborts its pass in flight (pump thread).

        The command is already in the actor's inbox, ahead of the retried step, so the
        actor parks the job at its last token boundary right after the aborted pass
        returns instead of finishing a step nobody will wait for. Reading ``_active``
        and ``_session`` from this thread is safe: each is one reference, and
        ``interrupt`` only sets a flag that onnxruntime checks.
        """
        if isinstance(record, (rp.Pause, rp.Cancel)):
            active, session = self._active, self._session
            if active is not None and session is not None and active.job_id == record.job_id:
                session.interrupt()

    def _on_tick(self, now: float) -> list[Frames]:
        if not self._silent and now - self._heard_at > self._liveness * self._heartbeat_s:
            self._silent = True
            self.actor_ref.tell(_SchedulerSilent())
        count, nbytes = self._stats
        self._beat_seq += 1
        beat = rp.Heartbeat(boot=self._boot, seq=self._beat_seq, snapshots=count,
                            snapshot_bytes=nbytes)
        return [[rp.encode(beat)]]

    # ---- messages -------------------------------------------------------------------

    def on_receive(self, message: Any) -> None:
        if isinstance(message, _Step):
            self._step()
        elif isinstance(message, _Cmd):
            handler = self._HANDLERS.get(type(message.command))
            if handler is None:
                logger.warning("runner: no handler for {}", message.command.kind)
            else:
                handler(self, message.command)
        elif isinstance(message, _Unacked):
            self._on_unacked(message.seq)
        elif isinstance(message, _SchedulerSilent):
            if self._active is not None:
                # Reported like any pause: a scheduler that was only slow re-queues and
                # resumes the job; a dead one never reads it, and its successor is told
                # about the parked job in our next Hello.
                logger.warning("the scheduler is silent; parking the running job")
                self._park_active(report=True)
        elif isinstance(message, _Boot):
            self._on_boot()

    def _report(self, report: rp.Report) -> None:
        assert self._outbox is not None
        self._outbox.send([rp.encode(report)])

    def _update_stats(self) -> None:
        self._stats = (len(self._lot) + len(self._orphans), self._lot.nbytes)

    def _on_boot(self) -> None:
        if self._preload:
            self._load(self._preload, report=False)
        self._hello()

    def _hello(self) -> None:
        jobs = {job_id: len(self._lot.get(job_id).progress.generated_ids)  # type: ignore[union-attr]
                for job_id in self._lot.job_ids()}
        for job_id, path in self._orphans.items():
            peek = peek_progress(path)
            if peek is not None:
                jobs[job_id] = len(peek.get("generated_ids", ()))
        self._hello_beat = self._beat_seq
        model = self._session.model_id if self._session is not None else None
        self._report(rp.Hello(boot=self._boot, pid=os.getpid(), model_id=model, jobs=jobs))
        logger.info("hello sent (model {}, {} jobs held)", model, len(jobs))

    def _on_unacked(self, seq: int) -> None:
        if seq <= self._hello_beat + 1:
            return  # a reply to a beat that left before our Hello: it is on its way
        logger.info("the scheduler does not know us (restarted?); parking and saying hello")
        self._park_active(report=False)
        self._hello()

    # ---- commands -------------------------------------------------------------------

    def _on_load(self, cmd: rp.Load) -> None:
        self._park_active(report=True)
        self._load(cmd.model_id, report=True)

    def _load(self, model_id: str, *, report: bool) -> bool:
        if self._session is not None and self._session.model_id == model_id:
            if report:
                self._report(rp.ModelLoaded(model_id=model_id, seconds=0.0))
            return True
        t0 = time.perf_counter()
        try:
            from uniun.models.session import DecoderSession
            from uniun.models.store import ensure_model

            if self._session is not None:
                self._session.unload()
                self._session = None
            path = ensure_model(model_id)
            self._session = DecoderSession.load(path, threads=self._threads, model_id=model_id)
        except Exception as err:
            logger.exception("loading model {} failed", model_id)
            if report:
                self._report(rp.LoadFailed(model_id=model_id, message=str(err)[:500]))
            return False
        seconds = time.perf_counter() - t0
        logger.info("model {} loaded in {:.2f} s", model_id, seconds)
        if report:
            self._report(rp.ModelLoaded(model_id=model_id, seconds=seconds))
        return True

    def _on_start(self, cmd: rp.Start) -> None:
        log = logger.bind(job=cmd.job_id)
        self._park_active(report=True)
        if not self._load(cmd.model_id, report=False):
            self._report(rp.Failed(job_id=cmd.job_id, message=f"model {cmd.model_id} failed to load"))
            return
        state = self._take_parked(cmd.job_id)
        try:
            if state is not None and continues(state, cmd.model_id, cmd.tokens, cmd.text):
                gen = self._session.resume(state)
            else:
                if state is not None:
                    state.drop_kv()
                gen = self._fresh(cmd)
        except Exception as err:
            log.warning("cannot start: {}", err)
            self._report(rp.Failed(job_id=cmd.job_id, message=str(err)[:500]))
            return
        done = already_done(gen)
        if done is not None:  # the previous runner died between its last token and Finished
            p = gen.progress
            self._report(rp.Finished(job_id=cmd.job_id, finish_reason=done,
                                     prompt_tokens=len(p.prompt_ids),
                                     generated=len(p.generated_ids), seconds=0.0))
            return
        self._activate(cmd.job_id, gen, cmd.grant, resumed=bool(cmd.tokens))

    def _fresh(self, cmd: rp.Start) -> Generation:
        messages = [{"role": r, "content": c} for r, c in cmd.messages] if cmd.messages else None
        gen = self._session.start(cmd.prompt, messages=messages,
                                  max_new_tokens=cmd.max_new_tokens, sampling=cmd.sampling,
                                  job_id=cmd.job_id)
        if not cmd.tokens and cmd.seed is None:
            return gen
        progress = gen.progress
        progress.generated_ids = list(cmd.tokens)
        progress.text = cmd.text
        if cmd.seed is not None:
            progress.seed = int(cmd.seed)
        return self._session.recompute(progress)

    def _on_resume(self, cmd: rp.Resume) -> None:
        self._park_active(report=True)
        state = self._take_parked(cmd.job_id)
        if state is None or len(state.progress.generated_ids) != cmd.generated:
            if state is not None:
                self._lot.park(cmd.job_id, state)
            self._report(rp.Unknown(job_id=cmd.job_id))
            return
        if not self._load(state.progress.model_id or self._preload or "", report=False):
            self._lot.park(cmd.job_id, state)
            self._report(rp.Failed(job_id=cmd.job_id, message="model failed to load"))
            return
        try:
            gen = self._session.resume(state)
        except Exception as err:
            logger.bind(job=cmd.job_id).warning("cannot resume: {}", err)
            self._report(rp.Failed(job_id=cmd.job_id, message=str(err)[:500]))
            return
        self._activate(cmd.job_id, gen, cmd.grant, resumed=True)

    def _activate(self, job_id: str, gen: Generation, grant: int, *, resumed: bool) -> None:
        p = gen.progress
        stop_at = len(p.generated_ids) + grant if grant > 0 else None
        self._active = _Active(job_id, gen, time.perf_counter(), stop_at)
        self._update_stats()
        self._report(rp.Started(job_id=job_id, resumed=resumed, prompt_tokens=len(p.prompt_ids),
                                recomputed=gen.recomputed_tokens, seed=int(p.seed)))
        logger.bind(job=job_id).debug("segment started at {} tokens ({} to recompute, grant {})",
                                      len(p.generated_ids), gen.recomputed_tokens, grant or "-")
        self.actor_ref.tell(_Step())

    def _on_pause(self, cmd: rp.Pause) -> None:
        if self._active is not None and self._active.job_id == cmd.job_id:
            self._park_active(report=True)

    def _on_cancel(self, cmd: rp.Cancel) -> None:
        active = self._active
        if active is not None and active.job_id == cmd.job_id:
            self._active = None
            self._report(rp.Cancelled(job_id=cmd.job_id, seconds=active.lap()))
            logger.bind(job=cmd.job_id).info("cancelled after {} tokens",
                                             len(active.gen.generated_ids))
        self._forget(cmd.job_id)

    def _on_drop(self, cmd: rp.Drop) -> None:
        if self._active is not None and self._active.job_id == cmd.job_id:
            return  # the scheduler believes it is parked; a Pause or Cancel will follow
        self._forget(cmd.job_id)

    _HANDLERS: dict[type, Any] = {
        rp.Load: _on_load, rp.Start: _on_start, rp.Resume: _on_resume, rp.Pause: _on_pause,
        rp.Cancel: _on_cancel, rp.Drop: _on_drop,
    }

    # ---- the step -------------------------------------------------------------------

    def _step(self) -> None:
        a = self._active
        if a is None:
            return
        try:
            ev = self._session.advance(a.gen, PREFILL_CHUNK)  # one bounded pass, or a token
            if ev is None:  # a prefill/replay pass: let control messages in first
                self.actor_ref.tell(_Step())
                return
        except Interrupted:  # a pause/cancel is next in the inbox; retried if it was not ours
            self.actor_ref.tell(_Step())
            return
        except Exception as err:
            logger.bind(job=a.job_id).exception("generation failed")
            self._active = None
            self._report(rp.Failed(job_id=a.job_id, message=str(err)[:500], seconds=a.lap()))
            return
        self._report(rp.Token(job_id=a.job_id, seq=ev.seq, token_id=ev.token_id,
                              text=ev.text_delta, seconds=a.lap()))
        if ev.finished:
            self._active = None
            p = a.gen.progress
            self._report(rp.Finished(job_id=a.job_id, finish_reason=ev.finish_reason or "stop",
                                     prompt_tokens=len(p.prompt_ids),
                                     generated=len(p.generated_ids), seconds=a.lap()))
            self._update_stats()
        elif a.stop_at is not None and len(a.gen.generated_ids) >= a.stop_at:
            self._park_active(report=True, grant_spent=True)
        else:
            self.actor_ref.tell(_Step())

    # ---- parking --------------------------------------------------------------------

    def _park_active(self, *, report: bool, grant_spent: bool = False) -> None:
        a = self._active
        if a is None:
            return
        self._active = None
        generated = len(a.gen.generated_ids)
        self._lot.park(a.job_id, self._session.park(a.gen))
        self._update_stats()
        if report:
            self._report(rp.Paused(job_id=a.job_id, generated=generated, seconds=a.lap(),
                                   grant_spent=grant_spent))
        logger.bind(job=a.job_id).debug("parked at {} tokens", generated)

    def _take_parked(self, job_id: str) -> ParkedState | None:
        if job_id in self._lot:
            return self._lot.take(job_id)
        path = self._orphans.pop(job_id, None)
        if path is None:
            return None
        try:
            state = ParkedState.load(path)
            logger.bind(job=job_id).info("continuing from the spilled snapshot {}", path)
        except SnapshotCorrupt as err:
            logger.bind(job=job_id).warning("spilled snapshot unusable ({}); recomputing", err)
            state = None
        path.unlink(missing_ok=True)
        self._update_stats()
        return state

    def _forget(self, job_id: str) -> None:
        self._lot.discard(job_id)
        path = self._orphans.pop(job_id, None)
        if path is not None:
            path.unlink(missing_ok=True)
        self._update_stats()
