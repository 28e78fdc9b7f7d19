"""Test helpers for the scheduler core: a driver that feeds the core the way its host
actor does (one input, then ``pump()``), recording every Effects, and the real runner.

The runner is :class:`~uniun.actors.runner.jobs.RunnerJobs` itself, the runner process's
job bookkeeping, fed the way ``RunnerWorker`` feeds it (each command, each step) with the
fake model of ``tests/actors/runner/fake_session.py`` (token ``seq`` of every job is id
``100 + seq`` and text ``"t<seq> "``, so a recompute continues exactly where the last
runner stopped). Its spill files live in a temporary folder the driver owns, so a runner
that dies leaves them to the next one as a real one does. Nothing here opens a socket,
starts a thread or reads a clock.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.actors.policy.harness import MODEL, FakeClock, spec
from tests.actors.runner.fake_session import FakeSession, text_of, token_id
from uniun.actors.policy import PolicyConfig, make_policy
from uniun.actors.runner.jobs import RunnerJobs
from uniun.actors.scheduler.admission import CHAT_RESERVE_SHARE, CLIENT_SHARE
from uniun.actors.scheduler.core import SchedulerCore
from uniun.actors.scheduler.effects import KEEP_TIMER, Effects, JAccept, JFinish, JToken
from uniun.actors.scheduler.journal import JournalEntry
from uniun.models.kv import JobProgress, ParkedState
from uniun.models.parking import ParkingLot
from uniun.protocol import requests as rq, runner_records as rp

__all__ = ["MODEL", "TOO_LONG", "Driver", "Runner", "assert_persisted_before_told",
           "commands", "entry", "msgs", "spec", "text_of", "token_id"]

# A prompt the fake model's context cannot hold: the runner answers its Start ``Failed``.
TOO_LONG = "w " * 600


def spill_path(folder: Path, job_id: str) -> Path:
    """One spill file per job, as the parking lot names them: a newer one replaces it."""
    return folder / f"{job_id}.kvsnap"


class Runner:
    """A runner process as the core sees it: the real ``RunnerJobs`` and its parking lot,
    handed each command or step the way ``RunnerWorker.on_receive`` hands them, its
    reports collected. ``model_id``: the model it preloads (None: none)."""

    def __init__(self, *, pid: int, model_id: str | None, spill_dir: Path,
                 clock: FakeClock) -> None:
        self.pid = pid
        self.spill_dir = spill_dir
        self.received: list[rp.Command] = []
        self._out: list[rp.Report] = []
        self.lot = ParkingLot(spill_dir=spill_dir)
        self.jobs = RunnerJobs(store=None, threads=1, parking=self.lot, preload=model_id,
                               report=self._out.append, step_again=lambda: None,
                               open_session=FakeSession, clock=clock)
        self.jobs.find_orphans(spill_dir)  # what RunnerWorker.on_start does
        self.jobs.preload_model()  # then _Boot: the preload, then Hello

    def hello(self) -> rp.Hello:
        return rp.Hello(boot=f"boot-{self.pid}", pid=self.pid, model_id=self.jobs.model_id,
                        jobs=self.jobs.held())

    @property
    def active(self) -> str | None:
        return self.jobs.active.job_id if self.jobs.active is not None else None

    def holds(self, job_id: str) -> bool:
        """The runner holds a parked or spilled record of the job (it would resume it)."""
        return job_id in self.jobs.held()

    def handle(self, cmd: rp.Command) -> list[rp.Report]:
        """One command; a Start whose tokens are not the fake model's stream is a core
        bug (it would have the runner continue after tokens no client saw), refused loudly."""
        if isinstance(cmd, rp.Start):
            assert cmd.tokens == [token_id(s) for s in range(len(cmd.tokens))], cmd
            assert cmd.text == "".join(text_of(s) for s in range(len(cmd.tokens))), cmd
        self.received.append(cmd)
        self.jobs.handle(cmd)
        return self._drain()

    def step(self) -> list[rp.Report]:
        """One ``_Step``: a token of the active job (or a prefill pass), maybe its end."""
        self.jobs.step()
        return self._drain()

    def spill_parked(self) -> None:
        """Write every parked job to the spill folder (a runner under its memory cap)."""
        for job_id in self.lot.job_ids():
            self.lot.take(job_id).spill(spill_path(self.spill_dir, job_id))

    def _drain(self) -> list[rp.Report]:
        out, self._out[:] = list(self._out), []
        return out


def entry(job: str, kind: str, tokens: int, **fields: Any) -> JournalEntry:
    """A journaled job that had started and streamed ``tokens`` tokens (seed 9)."""
    return JournalEntry(spec=spec(job, kind, **fields), accepted_at=990.0, seed=9,
                        started=True, started_at=991.0, first_token_at=991.5,
                        token_ids=[token_id(s) for s in range(tokens)],
                        texts=[text_of(s) for s in range(tokens)])


class Driver:
    """A ``SchedulerCore`` on a fake clock, fed like ``SchedulerHost`` feeds it.

    Every method returns the Effects of what it fed (input and pump, merged); ``history``
    keeps each Effects separately, as the host applies them. Commands go to the fake
    runner's inbox and reach it only in :meth:`deliver`, so a test can order a race.
    """

    def __init__(self, *, queue_cap: int = 100, config: PolicyConfig | None = None,
                 entries: Iterable[JournalEntry] = (), observe: bool = False,
                 chat_reserve_share: float = CHAT_RESERVE_SHARE,
                 client_share: float = CLIENT_SHARE) -> None:
        self._spill = tempfile.TemporaryDirectory(prefix="uniun-driver-")  # removed with us
        self.spill_dir = Path(self._spill.name)
        # observe: record the timeline and make metric observations (the recorder's own
        # tests turn it on; the others assert the job writes alone)
        self.clock = FakeClock()
        policy = make_policy("uniun", config, self.clock, wall_clock=self.clock)
        self.core = SchedulerCore(policy=policy, queue_cap=queue_cap, clock=self.clock,
                                  wall=self.clock, processes=lambda: {"scheduler": 1},
                                  segments=observe, metrics=observe,
                                  chat_reserve_share=chat_reserve_share,
                                  client_share=client_share)
        self.history: list[Effects] = []
        self.runner: Runner | None = None
        self.inbox: list[rp.Command] = []
        self.wake_at: float | None = None  # the host's one timer
        self.replayed = list(entries)
        if self.replayed:
            self._host(self.core.replay(self.replayed), pump=False)

    def _host(self, fx: Effects, *, pump: bool = True) -> Effects:
        merged = Effects().extend(fx)
        self.history.append(fx)
        if pump:
            pumped = self.core.pump()
            self.history.append(pumped)
            merged.extend(pumped)
        if self.runner is not None:
            self.inbox.extend(merged.commands)
        if merged.wake_at is not KEEP_TIMER:
            self.wake_at = merged.wake_at
        return merged

    # ---- inputs ----------------------------------------------------------------------

    def request(self, conn: bytes, request: rq.Request, owner: str | None = None) -> Effects:
        """``owner``: the client's CURVE key, as the front passes it (None: ipc)."""
        return self._host(self.core.request(conn, request, owner))

    def submit(self, conn: bytes, job_id: str, kind: str = "nataraj", *,
               owner: str | None = None, **fields: Any) -> Effects:
        return self.request(conn, rq.Submit(f"s-{job_id}", spec(job_id, kind, **fields)), owner)

    def cancel(self, conn: bytes, job_id: str) -> Effects:
        return self.request(conn, rq.Cancel(f"c-{job_id}", job_id))

    def attach(self, conn: bytes, job_id: str, after_seq: int = -1) -> Effects:
        return self.request(conn, rq.Attach(f"a-{job_id}", job_id, after_seq))

    def report(self, report: rp.Report) -> Effects:
        return self._host(self.core.report(report))

    def gone(self, conn: bytes) -> Effects:
        """The client connection ``conn`` went away."""
        return self._host(self.core.client_gone(conn))

    def told(self, conn: bytes, job: str, type: str | None = None) -> list[dict[str, Any]]:
        """Every message of the whole run for ``conn`` about ``job`` (replies included)."""
        return [m for fx in self.history for m in msgs(fx, conn, type, job)]

    def spilled(self, job_id: str, generated: int, max_new_tokens: int = 20,
                model_id: str = MODEL) -> Driver:
        """A dead runner left ``job_id``'s snapshot at ``generated`` tokens on disk."""
        progress = JobProgress(prompt_ids=[1], max_new_tokens=max_new_tokens, seed=7,
                               generated_ids=[token_id(s) for s in range(generated)],
                               text="".join(text_of(s) for s in range(generated)),
                               job_id=job_id, model_id=model_id)
        ParkedState(progress).spill(spill_path(self.spill_dir, job_id))
        return self

    def up(self, *, pid: int = 4242, model_id: str | None = MODEL) -> Effects:
        """A runner process starts (finding the spill files left in the driver's folder)
        and says hello."""
        self.runner = Runner(pid=pid, model_id=model_id, spill_dir=self.spill_dir,
                             clock=self.clock)
        return self._host(self.core.runner_up(self.runner.hello()))

    def down(self, reason: str = "killed", *, spill: bool = False) -> Effects:
        """The runner process died: what it held in memory and what was on its way to it
        is gone; its spill files stay (``spill``: it had spilled every parked job)."""
        if spill and self.runner is not None:
            self.runner.spill_parked()
        self.runner, self.inbox = None, []
        return self._host(self.core.runner_down(reason))

    def wake(self) -> Effects:
        """The host's timer fires (the clock jumps to it; a stale timer is harmless)."""
        if self.wake_at is not None:
            self.clock.t = max(self.clock.t, self.wake_at)
        return self._host(Effects())

    # ---- the runner at work ----------------------------------------------------------

    def deliver(self) -> Effects:
        """The runner handles every command sent so far (and those its reports cause)."""
        fx = Effects()
        while self.inbox and self.runner is not None:
            for report in self.runner.handle(self.inbox.pop(0)):
                fx.extend(self.report(report))
        return fx

    def step(self, n: int = 1) -> Effects:
        """``n`` decode steps, without reading the commands that wait in the inbox."""
        fx = Effects()
        for _ in range(n):
            self.clock.advance(0.01)
            assert self.runner is not None
            for report in self.runner.step():
                fx.extend(self.report(report))
        return fx

    def run(self, n: int = 10_000) -> Effects:
        """Up to ``n`` rounds of deliver + step, stopping once nothing is left to do."""
        fx = Effects()
        for _ in range(n):
            fx.extend(self.deliver())
            if self.runner is None or self.runner.active is None:
                break
            fx.extend(self.step())
        return fx


# ---- reading Effects -----------------------------------------------------------------


def msgs(fx: Effects, conn: bytes | None = None, type: str | None = None,
         job: str | None = None) -> list[dict[str, Any]]:
    """The messages of ``fx``, filtered by connection, message type and job id."""
    return [s.msg for s in fx.sends
            if (conn is None or s.conn == conn) and (type is None or s.msg["type"] == type)
            and (job is None or s.msg.get("job_id") == job)]


def commands(fx: Effects, cls: type | None = None) -> list[rp.Command]:
    return [c for c in fx.commands if cls is None or isinstance(c, cls)]


def assert_persisted_before_told(history: Iterable[Effects],
                                 replayed: Iterable[JournalEntry] = ()) -> None:
    """Persist before telling, over a whole run: every ``accepted`` reply, ``token``
    event and terminal event an Effects carries is already in the journal when the host
    sends it (written by an earlier Effects, by this one's journal writes, which the host
    commits first, or replayed), with the same content."""
    journaled: dict[tuple[str, str, int], Any] = {}
    for e in replayed:
        journaled[("accepted", e.spec.job_id, 0)] = True
        journaled.update({("token", e.spec.job_id, s): t for s, t in enumerate(e.texts)})
        if e.final is not None:
            journaled[("final", e.spec.job_id, 0)] = e.final
    for i, fx in enumerate(history):
        for w in fx.journal:
            if isinstance(w, JAccept):
                journaled[("accepted", w.spec.job_id, 0)] = True
            elif isinstance(w, JToken):
                journaled[("token", w.job_id, w.seq)] = w.text
            elif isinstance(w, JFinish):
                journaled[("final", w.job_id, 0)] = w.final
        for send in fx.sends:
            msg, job = send.msg, send.msg.get("job_id")
            if msg["type"] == "accepted":
                key, value = ("accepted", job, 0), True
            elif msg["type"] == "token":
                key, value = ("token", job, msg["seq"]), msg["text"]
            elif msg["type"] in ("done", "error") and "re" not in msg:
                key, value = ("final", job, 0), msg
            else:
                continue
            assert journaled.get(key) == value, (
                f"Effects #{i} tells {msg} before the journal holds it")
