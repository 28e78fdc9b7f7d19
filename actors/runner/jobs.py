"""The runner's jobs: the decoder session, the one active job, the parked ones.

Why apart from :mod:`uniun.actors.runner.worker`: the worker is the actor and its socket
plumbing (heartbeats, liveness, the Hello handshake); this is the model work it drives,
with no socket and no pykka in sight. The worker hands every scheduler command to
:meth:`RunnerJobs.handle` and every ``_Step`` to :meth:`RunnerJobs.step`; what goes out
leaves through ``report`` (a record to the scheduler) and ``step_again`` (tell the actor
another ``_Step``, so that the next command in its inbox is handled before the next pass).

State: at most one *active* job (a live ``Generation``); every other job the runner was
told about sits in the :class:`~uniun.models.parking.ParkingLot` (trim, then spill, then
drop under its caps; the job's progress always stays, so it can resume by recompute).
Spill files a previous runner process left are found at start (``orphans``) and offered
in ``Hello``, so a restarted runner can continue such a job from disk. How long a pass
is, and the test paces, are ``pacing.py``'s.

Every command handler is total: bad or stale commands are logged and answered, never
raised (an exception in the actor's ``tell`` handler would stop the actor and the process).

The worker's pump thread calls :meth:`RunnerJobs.preempt` (under a lock that starting a
job also takes) and reads :attr:`RunnerJobs.stats` (one reference, replaced whole).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from loguru import logger

from uniun.actors.runner.pacing import Pacing, preempts
from uniun.actors.runner.reuse import already_done, continues, find_orphans, peek_progress
from uniun.models.convert.recipes import ensure_model
from uniun.models.decoder_model import Interrupted
from uniun.models.generate import Generation
from uniun.models.kv import ParkedState, SnapshotCorrupt
from uniun.models.parking import ParkingLot
from uniun.models.store import ModelStore
from uniun.protocol import runner_records as rp

__all__ = ["RunnerJobs"]


@dataclass
class _Active:
    job_id: str
    gen: Generation
    t0: float  # when the segment's runner time was last reported (on ``clock``)
    stop_at: int | None  # generated count at which the grant is spent
    clock: Callable[[], float] = time.perf_counter
    chat: bool = False  # preempted by nothing: its prompt passes need no time bound

    def lap(self) -> float:
        """Runner seconds since the last report of this segment."""
        self.t0, then = self.clock(), self.t0
        return self.t0 - then


class RunnerJobs:
    """See the module docstring."""

    def __init__(self, *, store: ModelStore | None, threads: int, parking: ParkingLot,
                 preload: str | None, report: Callable[[rp.Report], None],
                 step_again: Callable[[], None], spinning: bool = True,
                 before_start: Callable[[rp.Start], None] | None = None,
                 before_load: Callable[[], None] = lambda: None,
                 open_session: Callable[[str], Any] | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 pacing: Pacing | None = None,
                 size_parking: Callable[[Any, ParkingLot], None] | None = None) -> None:
        self._store = store
        self.pacing = pacing or Pacing(clock=clock)  # pass sizes, test paces (pacing.py)
        # Sizes the parking for each model loaded (runner_main, docs/kv-cache.md).
        self._size_parking = size_parking
        # model id -> a loaded session; the real one (ONNX Runtime) unless a unit test
        # gives a fake model. ``clock``: what a Token's runner seconds are measured on.
        self._open_session = open_session or self._open_decoder
        self._clock = clock
        self._before_load = before_load  # announces the load's silence (RunnerWorker)
        self._before_start = before_start  # test fault hook (runner_main.crash_hook)
        self._threads = threads
        self._spinning = spinning  # docs/device.md: part of the thread budget
        self._lot = parking
        self._preload = preload
        self._report = report
        self._step_again = step_again
        self.session: Any = None  # DecoderSession, imported lazily (onnxruntime)
        self._preempting = threading.Lock()  # preempt() (pump thread) against _activate
        self.active: _Active | None = None
        self._orphans: dict[str, Path] = {}
        self._shower: tuple[Any, Any] | None = None  # (session, its token text/bytes lookup)
        # (snapshots, snapshot bytes, trimmed, spilled), read by the pump thread
        self.stats = (0, 0, 0, 0)

    def find_orphans(self, spill_dir: Path) -> None:
        """Adopt the spill files a previous runner process left in ``spill_dir``."""
        self._orphans = find_orphans(spill_dir)
        self._update_stats()  # the heartbeats count them from the first beat

    def preload_model(self) -> None:
        """Load the chat model named at start, if any (a failure is logged, not reported)."""
        if self._preload and self.load(self._preload, report=False):
            self._warm()

    def _warm(self) -> None:
        """One short generation before the Hello: the first chat must not pay for ONNX
        Runtime's first-run allocations (ready means a chat sent now is answered)."""
        t0 = time.perf_counter()
        try:
            # A chat, as a user sends one: the chat template is compiled and the system
            # prompt's prefix cache filled, which the first chat paid for otherwise.
            gen = self.session.start(
                messages=[{"role": "user", "content": "Hello! How are you today?"}],
                max_new_tokens=2, job_id="warm-up")
            t1 = self._clock()
            self.session.step(gen)  # the prompt in one pass, then a decode step: the
            t2 = self._clock()  # model's first costs
            step_s = None if gen.finished else (self.session.step(gen), self._clock() - t2)[1]
            self.pacing.warmed(len(gen.progress.prompt_ids), t2 - t1, step_s)
        except Exception:  # a model that cannot warm up still serves (or fails) jobs
            logger.exception("warming the model up failed")
            return
        logger.info("model warmed up in {:.2f} s", time.perf_counter() - t0)

    @property
    def model_id(self) -> str | None:
        return self.session.model_id if self.session is not None else None

    def held(self) -> dict[str, int]:
        """Generated-token count of every job held (parked or spilled), for ``Hello``."""
        jobs = {job_id: len(self._lot.get(job_id).progress.generated_ids)  # type: ignore[union-attr]
                for job_id in self._lot.job_ids()}
        for job_id, path in self._orphans.items():
            peek = peek_progress(path)
            if peek is not None:
                jobs[job_id] = len(peek.get("generated_ids", ()))
        return jobs

    def _update_stats(self) -> None:
        lot = self._lot.stats()
        self.stats = (len(self._lot) + len(self._orphans), self._lot.nbytes, lot.trimmed,
                      lot.spilled)

    # ---- commands -------------------------------------------------------------------

    def handle(self, command: rp.Command) -> None:
        """Apply one scheduler command (total: never raises for a bad or stale one)."""
        handler = self._HANDLERS.get(type(command))
        if handler is None:
            logger.warning("runner: no handler for {}", command.kind)
        else:
            handler(self, command)

    def _on_load(self, cmd: rp.Load) -> None:
        self.park_active(report=True)
        self.load(cmd.model_id, report=True)

    def load(self, model_id: str, *, report: bool) -> bool:
        """Make ``model_id`` the loaded model (a no-op if it is); False if it failed."""
        if self.session is not None and self.session.model_id == model_id:
            if report:
                self._report(rp.ModelLoaded(model_id=model_id, seconds=0.0))
            return True
        t0 = time.perf_counter()
        try:
            if self.session is not None:
                self.session.unload()
                self.session = None
            self.pacing.new_model()
            self.session = self._open_session(model_id)
            if self._size_parking is not None:
                self._size_parking(self.session, self._lot)
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

    def _open_decoder(self, model_id: str) -> Any:
        """The model's ONNX session (fetched and converted into the store first if needed)."""
        from uniun.models.session import DecoderSession  # onnxruntime: loaded on demand

        if self._store is None:
            raise RuntimeError("no model store to load models from")
        path = ensure_model(model_id, self._store)
        self._before_load()  # parsing the tokenizer holds the GIL: no beats for a while
        return DecoderSession.load(path, threads=self._threads, model_id=model_id,
                                   spinning=self._spinning)

    def _on_start(self, cmd: rp.Start) -> None:
        log = logger.bind(job=cmd.job_id)
        if self._before_start is not None:
            self._before_start(cmd)
        self.park_active(report=True)
        if not self.load(cmd.model_id, report=False):
            self._report(rp.Failed(job_id=cmd.job_id,
                                   message=f"model {cmd.model_id} failed to load"))
            return
        state = self._take_parked(cmd.job_id)
        try:
            if state is not None and continues(state, cmd.model_id, cmd.tokens, cmd.text):
                gen = self.session.resume(state)
            else:
                if state is not None:
                    state.drop_kv()
                gen = self._fresh(cmd)
        except Exception as err:  # noqa: BLE001 - any failure to start is the job's answer
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
        self._activate(cmd.job_id, gen, cmd.grant, resumed=bool(cmd.tokens),
                       chat=cmd.job_kind == "chat")

    def _fresh(self, cmd: rp.Start) -> Generation:
        messages = cmd.message_maps() or None
        # The job map's extensions only when the job uses them: a session (or a test's
        # stand-in for one) that predates them still runs every other job.
        extras = {k: v for k, v in (("logprobs", cmd.logprobs), ("tools", cmd.tools),
                                    ("tool_choice", cmd.tool_choice),
                                    ("cache_prompt", cmd.cache_prompt or None))
                  if v is not None}
        gen = self.session.start(cmd.prompt, messages=messages,
                                 max_new_tokens=cmd.max_new_tokens, sampling=cmd.sampling,
                                 job_id=cmd.job_id, stop=tuple(cmd.stop), format=cmd.format,
                                 **extras)
        if not cmd.tokens and cmd.seed is None:
            return gen
        progress = gen.progress
        progress.generated_ids = list(cmd.tokens)
        progress.text = cmd.text
        if cmd.seed is not None:
            progress.seed = int(cmd.seed)
        return self.session.recompute(progress)

    def _on_resume(self, cmd: rp.Resume) -> None:
        self.park_active(report=True)
        state = self._take_parked(cmd.job_id)
        if state is None or len(state.progress.generated_ids) != cmd.generated:
            if state is not None:
                self._lot.park(cmd.job_id, state)
            self._report(rp.Unknown(job_id=cmd.job_id))
            return
        if not self.load(state.progress.model_id or self._preload or "", report=False):
            self._lot.park(cmd.job_id, state)
            self._report(rp.Failed(job_id=cmd.job_id, message="model failed to load"))
            return
        try:
            gen = self.session.resume(state)
        except Exception as err:  # noqa: BLE001 - any failure to resume is the job's answer
            logger.bind(job=cmd.job_id).warning("cannot resume: {}", err)
            self._report(rp.Failed(job_id=cmd.job_id, message=str(err)[:500]))
            return
        self._activate(cmd.job_id, gen, cmd.grant, resumed=True)

    def _activate(self, job_id: str, gen: Generation, grant: int, *, resumed: bool,
                  chat: bool = False) -> None:
        p = gen.progress
        stop_at = len(p.generated_ids) + grant if grant > 0 else None
        with self._preempting:
            self.active = _Active(job_id, gen, self._clock(), stop_at, self._clock, chat)
            self.session.clear_interrupt()  # one meant for the job parked before this one
        self.pacing.segment(self.active.t0, len(p.generated_ids))
        self._update_stats()
        self._report(rp.Started(job_id=job_id, resumed=resumed, prompt_tokens=len(p.prompt_ids),
                                recomputed=gen.recomputed_tokens, seed=int(p.seed)))
        logger.bind(job=job_id).debug("segment started at {} tokens ({} to recompute, grant {}"
                                      "{})", len(p.generated_ids), gen.recomputed_tokens,
                                      grant or "-", ", chat" if chat else "")
        self._step_again()

    def preempt(self, command: rp.Command) -> bool:
        """Abort the active job's pass if ``command`` takes the model from it (pump thread).
        Locked with :meth:`_activate`: a preemption never aborts the next job's pass."""
        with self._preempting:
            a, session = self.active, self.session
            if a is None or session is None or not preempts(command, a.job_id):
                return False
            session.interrupt()
            return True

    def _on_pause(self, cmd: rp.Pause) -> None:
        if self.active is not None and self.active.job_id == cmd.job_id:
            self.park_active(report=True)

    def _on_cancel(self, cmd: rp.Cancel) -> None:
        active = self.active
        if active is not None and active.job_id == cmd.job_id:
            self.active = None
            self._report(rp.Cancelled(job_id=cmd.job_id, seconds=active.lap()))
            logger.bind(job=cmd.job_id).info("cancelled after {} tokens",
                                             len(active.gen.generated_ids))
        self._forget(cmd.job_id)

    def _on_drop(self, cmd: rp.Drop) -> None:
        if self.active is not None and self.active.job_id == cmd.job_id:
            return  # the scheduler believes it is parked; a Pause or Cancel will follow
        self._forget(cmd.job_id)

    _HANDLERS: ClassVar[dict[type, Any]] = {
        rp.Load: _on_load, rp.Start: _on_start, rp.Resume: _on_resume, rp.Pause: _on_pause,
        rp.Cancel: _on_cancel, rp.Drop: _on_drop,
    }

    # ---- the step -------------------------------------------------------------------

    def step(self) -> None:
        """One bounded unit of the active job's work: a prefill/replay pass or one token."""
        a = self.active
        if a is None:
            return
        try:
            covered, t0 = a.gen.kv_length, self._clock()
            ev = self.session.advance(a.gen, self.pacing.positions(bounded=not a.chat))
            fed, seconds = a.gen.kv_length - covered, self._clock() - t0
            if ev is None:  # a prefill/replay pass: let control messages in first
                self.pacing.after_pass(fed, seconds)
                self._step_again()
                return
        except Interrupted:  # a pause/cancel is next in the inbox; retried if it was not ours
            self._step_again()
            return
        except Exception as err:  # noqa: BLE001 - logged with its traceback; the job fails
            logger.bind(job=a.job_id).exception("generation failed")
            self.active = None
            self._report(rp.Failed(job_id=a.job_id, message=str(err)[:500], seconds=a.lap()))
            return
        self.pacing.after_token(fed, seconds, len(a.gen.generated_ids))
        self._report(rp.Token(job_id=a.job_id, seq=ev.seq, token_id=ev.token_id,
                              text=ev.text_delta, seconds=a.lap(),
                              logprobs=self._logprobs(a.gen, ev.logprobs)))
        if ev.finished:
            self.active = None
            p = a.gen.progress
            self._report(rp.Finished(job_id=a.job_id, finish_reason=ev.finish_reason or "stop",
                                     prompt_tokens=len(p.prompt_ids),
                                     generated=len(p.generated_ids), seconds=a.lap()))
            self._update_stats()
        elif a.stop_at is not None and len(a.gen.generated_ids) >= a.stop_at:
            self.park_active(report=True, grant_spent=True)
        else:
            self._step_again()

    def _logprobs(self, gen: Generation, lp: Any) -> list[Any] | None:
        """A token's log-probabilities in the runner's compact form, for a job that asked
        (the scheduler expands it: ``protocol.messages.expand_logprobs``)."""
        if lp is None:
            return None
        from uniun.models.constrain import token_bytes
        from uniun.models.logprobs import logprobs_record, token_shower

        session = self.session
        if self._shower is None or self._shower[0] is not session:  # one per loaded model
            vocab = int(session.config.get("vocab_size", 0)) or len(session.tokenizer)
            eos = gen.progress.eos_ids
            self._shower = (session, token_shower(
                lambda t: token_bytes(session.tokenizer, vocab, eos, t)))
        return logprobs_record(lp, self._shower[1])

    # ---- parking --------------------------------------------------------------------

    def park_active(self, *, report: bool, grant_spent: bool = False) -> None:
        """Park the active job, if any, at its last token boundary (``Paused`` if ``report``)."""
        a = self.active
        if a is None:
            return
        self.active = None
        generated = len(a.gen.generated_ids)
        self._lot.park(a.job_id, self.session.park(a.gen))
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

