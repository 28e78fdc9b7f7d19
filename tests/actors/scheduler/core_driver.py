"""Test helpers for the scheduler core: a fake runner, and a driver that feeds the core
the way its host actor does (one input, then ``pump()``), recording every Effects.

:class:`FakeRunner` answers the core's commands with the reports the runner's handlers
(``actors/runner/jobs.py``, driven by ``worker.py``) send, without a model: token
``seq`` of every job has id ``100 + seq`` and text ``"t<seq> "``, so a recompute
continues exactly where the last runner stopped, and a ``Start`` whose tokens are not
that stream is a core bug the fake refuses loudly. Nothing here opens a socket, starts a thread or reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tests.actors.policy.harness import MODEL, FakeClock, spec
from uniun.actors.policy import PolicyConfig, make_policy
from uniun.actors.scheduler.core import SchedulerCore
from uniun.actors.scheduler.effects import KEEP_TIMER, Effects, JAccept, JFinish, JToken
from uniun.actors.scheduler.journal import JournalEntry
from uniun.protocol import requests as rq
from uniun.protocol import runner_records as rp

__all__ = ["MODEL", "Driver", "FakeRunner", "assert_persisted_before_told", "commands",
           "entry", "msgs", "spec", "text_of", "token_id"]

PROMPT_TOKENS = 3


def token_id(seq: int) -> int:
    return 100 + seq


def text_of(seq: int) -> str:
    return f"t{seq} "


@dataclass
class _Held:
    """The runner's record of a job it was told about (the worker's parked progress)."""

    generated: int
    max_new_tokens: int
    seed: int


class FakeRunner:
    """A runner process as the core sees it. ``target[job]``: tokens after which the job
    stops on its own (finish_reason ``stop``); otherwise it runs to ``max_new_tokens``.
    A job in ``fail`` cannot start (the worker's ``Failed``, e.g. a prompt too long)."""

    def __init__(self, *, pid: int = 4242, model_id: str | None = MODEL,
                 target: dict[str, int] | None = None, fail: Iterable[str] = ()) -> None:
        self.pid, self.model_id = pid, model_id
        self.target = dict(target or {})
        self.fail = set(fail)
        self.records: dict[str, _Held] = {}
        self.active: str | None = None
        self.stop_at: int | None = None
        self.received: list[rp.Command] = []

    def hold(self, job_id: str, generated: int, max_new_tokens: int = 20) -> "FakeRunner":
        """Start up already holding a record (a spilled snapshot left by a dead runner)."""
        self.records[job_id] = _Held(generated, max_new_tokens, seed=7)
        return self

    def hello(self) -> rp.Hello:
        return rp.Hello(boot=f"fake-{self.pid}", pid=self.pid, model_id=self.model_id,
                        jobs={j: r.generated for j, r in self.records.items()})

    # ---- commands, answered like the worker's handlers ---------------------------------

    def handle(self, cmd: rp.Command) -> list[rp.Report]:
        """Like ``RunnerJobs.handle``: a Resume it cannot honour as asked is ``Unknown``."""
        self.received.append(cmd)
        if isinstance(cmd, rp.Load):
            out = self._park()
            self.model_id = cmd.model_id
            return out + [rp.ModelLoaded(model_id=cmd.model_id, seconds=0.0)]
        if isinstance(cmd, rp.Start):
            assert cmd.tokens == [token_id(s) for s in range(len(cmd.tokens))], cmd
            assert cmd.text == "".join(text_of(s) for s in range(len(cmd.tokens))), cmd
            out = self._park()
            self.model_id = cmd.model_id
            if cmd.job_id in self.fail:
                return out + [rp.Failed(job_id=cmd.job_id, message="prompt too long")]
            held = self.records.get(cmd.job_id)
            recomputed = 0
            if held is None or held.generated != len(cmd.tokens):
                recomputed = len(cmd.tokens)
                held = _Held(len(cmd.tokens), cmd.max_new_tokens,
                             cmd.seed if cmd.seed is not None else 7)
            held.max_new_tokens = cmd.max_new_tokens
            self.records[cmd.job_id] = held
            return out + self._activate(cmd.job_id, cmd.grant, bool(cmd.tokens), recomputed)
        if isinstance(cmd, rp.Resume):
            out = self._park()
            held = self.records.get(cmd.job_id)
            if held is None or held.generated != cmd.generated:
                return out + [rp.Unknown(job_id=cmd.job_id)]
            return out + self._activate(cmd.job_id, cmd.grant, True, 0)
        if isinstance(cmd, rp.Pause):
            return self._park() if self.active == cmd.job_id else []
        if isinstance(cmd, rp.Cancel):
            out: list[rp.Report] = []
            if self.active == cmd.job_id:
                self.active = None
                out.append(rp.Cancelled(job_id=cmd.job_id, seconds=0.0))
            self.records.pop(cmd.job_id, None)
            return out
        if isinstance(cmd, rp.Drop):
            if self.active != cmd.job_id:
                self.records.pop(cmd.job_id, None)
            return []
        raise AssertionError(f"the core sent an unknown command {cmd!r}")

    def step(self) -> list[rp.Report]:
        """One decode step of the active job: a token, then maybe its end or its pause."""
        job = self.active
        if job is None:
            return []
        held = self.records[job]
        seq = held.generated
        held.generated += 1
        out: list[rp.Report] = [rp.Token(job_id=job, seq=seq, token_id=token_id(seq),
                                         text=text_of(seq), seconds=0.01)]
        limit = min(self.target.get(job, held.max_new_tokens), held.max_new_tokens)
        if held.generated >= limit:
            self.active = None
            del self.records[job]
            reason = "length" if held.generated >= held.max_new_tokens else "stop"
            out.append(rp.Finished(job_id=job, finish_reason=reason,
                                   prompt_tokens=PROMPT_TOKENS, generated=held.generated,
                                   seconds=0.0))
        elif self.stop_at is not None and held.generated >= self.stop_at:
            out += self._park(grant_spent=True)
        return out

    def _activate(self, job: str, grant: int, resumed: bool, recomputed: int) -> list[rp.Report]:
        held = self.records[job]
        self.active = job
        self.stop_at = held.generated + grant if grant > 0 else None
        return [rp.Started(job_id=job, resumed=resumed, prompt_tokens=PROMPT_TOKENS,
                           recomputed=recomputed, seed=held.seed)]

    def _park(self, grant_spent: bool = False) -> list[rp.Report]:
        job, self.active = self.active, None
        if job is None:
            return []
        return [rp.Paused(job_id=job, generated=self.records[job].generated, seconds=0.0,
                          grant_spent=grant_spent)]


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
                 entries: Iterable[JournalEntry] = (), observe: bool = False) -> None:
        # observe: record the timeline and make metric observations (the recorder's own
        # tests turn it on; the others assert the job writes alone)
        self.clock = FakeClock()
        policy = make_policy("uniun", config, self.clock, wall_clock=self.clock)
        self.core = SchedulerCore(policy=policy, queue_cap=queue_cap, clock=self.clock,
                                  wall=self.clock, processes=lambda: {"scheduler": 1},
                                  segments=observe, metrics=observe)
        self.history: list[Effects] = []
        self.runner: FakeRunner | None = None
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

    def request(self, conn: bytes, request: rq.Request) -> Effects:
        return self._host(self.core.request(conn, request))

    def submit(self, conn: bytes, job_id: str, kind: str = "nataraj", **fields: Any) -> Effects:
        return self.request(conn, rq.Submit(f"s-{job_id}", spec(job_id, kind, **fields)))

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

    def up(self, runner: FakeRunner | None = None) -> Effects:
        self.runner = runner if runner is not None else FakeRunner()
        return self._host(self.core.runner_up(self.runner.hello()))

    def down(self, reason: str = "killed") -> Effects:
        """The runner process died: what it held and what was on its way to it is gone."""
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
