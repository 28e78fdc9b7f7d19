"""``FakeScheduler`` for the client tests: a real ROUTER socket in a thread.

It speaks protocol v1 with the real codec and validation (so every request the client
sends is checked by ``parse_request``), and its behaviour is scripted by the test:
which tokens a job produces, whether it answers at all, what an ``attach`` replays.
It is a fake of the scheduler *process* only; sockets and msgpack are real.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from uniun.protocol import codec, messages as m, requests as rq
from uniun.protocol.errors import ErrorCode, ProtocolError

RULES = rq.JobRules(default_model="fake-model")


@dataclass
class FakeJob:
    """A scripted job: the tokens it yields and how far it has got."""

    job_id: str
    tokens: list[str]
    sent: int = 0  # tokens sent so far
    owner: bytes | None = None  # ROUTER identity its events go to
    auto: bool = True  # stream everything right away
    finished: bool = False


@dataclass
class FakeScheduler:
    """Binds ``endpoint`` and answers requests from a thread until ``stop()``."""

    endpoint: str
    tokens: list[str] = field(default_factory=lambda: ["Hel", "lo", ",", " world"])
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    answer: Callable[[dict[str, Any]], bool] = lambda msg: True  # False: stay silent
    replay_overlap: int = 0  # on attach, resend this many tokens the client already has
    auto_stream: bool = True
    status_body: dict[str, Any] = field(default_factory=lambda: {"policy": "fake"})
    received: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._todo: queue.Queue[Callable[[], None]] = queue.Queue()
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._thread = threading.Thread(target=self._run, name="FakeScheduler", daemon=True)
        self.bound_endpoint = self.endpoint

    def start(self) -> FakeScheduler:
        self._thread.start()
        assert self._bound.wait(10), "FakeScheduler did not bind"
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def call(self, fn: Callable[[FakeScheduler], None]) -> None:
        """Run ``fn(self)`` on the socket thread (the socket is not thread-safe)."""
        self._todo.put(lambda: fn(self))

    # -- socket thread -----------------------------------------------------------

    def _run(self) -> None:
        ctx = zmq.Context.instance()
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.bind(self.endpoint)
        self.bound_endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._bound.set()
        try:
            while not self._stop.is_set():
                while not self._todo.empty():
                    self._todo.get()()
                if self.sock.poll(20):
                    ident, frame = self.sock.recv_multipart()
                    self._handle(ident, frame)
        finally:
            self.sock.close(linger=0)

    def send(self, ident: bytes | None, msg: dict[str, Any]) -> None:
        if ident is None:
            return
        with contextlib.suppress(zmq.ZMQError):  # EHOSTUNREACH: that connection is gone
            self.sock.send_multipart([ident, codec.encode(msg)])

    def send_raw(self, ident: bytes, frame: bytes) -> None:
        self.sock.send_multipart([ident, frame])

    def _handle(self, ident: bytes, frame: bytes) -> None:
        decoded = codec.try_decode(frame)
        if isinstance(decoded, ProtocolError):
            self.send(ident, m.reply_error(None, decoded))
            return
        try:
            req = rq.parse_request(decoded, RULES)
        except ProtocolError as err:
            self.send(ident, m.reply_error(rq.reply_to(decoded), err))
            return
        self.received.append(decoded)
        if not self.answer(decoded):
            return
        if isinstance(req, rq.Submit):
            job = self.jobs.get(req.job.job_id)
            if job is None:
                job = FakeJob(req.job.job_id, list(self.tokens), auto=self.auto_stream)
                self.jobs[job.job_id] = job
            job.owner = ident
            self.send(ident, m.reply_accepted(req.id, job.job_id, 0))
            if job.sent == 0:
                self.send(ident, m.event_started(job.job_id, "fake-model", False, 0))
            if job.auto:
                self.stream(job.job_id)
        elif isinstance(req, rq.Attach):
            job = self.jobs.get(req.job_id)
            if job is None:
                self.send(ident, m.reply_error(req.id, ProtocolError(
                    ErrorCode.NOT_FOUND, f"no job {req.job_id}", job_id=req.job_id)))
                return
            job.owner = ident
            self.send(ident, m.reply_accepted(req.id, job.job_id, 0, state="running"))
            job.sent = max(0, min(job.sent, req.after_seq + 1) - self.replay_overlap)
            if job.auto:
                self.stream(job.job_id)
        elif isinstance(req, rq.Cancel):
            job = self.jobs.pop(req.job_id, None)
            if job is None:
                self.send(ident, m.reply_error(req.id, ProtocolError(
                    ErrorCode.NOT_FOUND, f"no job {req.job_id}", job_id=req.job_id)))
            else:
                self.send(ident, m.reply_cancelled(req.id, req.job_id))
        elif isinstance(req, rq.StatusRequest):
            self.send(ident, m.reply_status(req.id, self.status_body))
        elif isinstance(req, rq.Ping):
            self.send(ident, m.reply_pong(req.id))
        else:
            self.send(ident, m.reply_ok(req.id))

    def stream(self, job_id: str, upto: int | None = None, finish: bool = True) -> None:
        """Send tokens ``sent..upto`` of a job (all by default), then ``done``."""
        job = self.jobs[job_id]
        end = len(job.tokens) if upto is None else upto
        while job.sent < end:
            self.send(job.owner, m.event_token(job_id, job.sent, job.tokens[job.sent]))
            job.sent += 1
        if finish and job.sent == len(job.tokens) and not job.finished:
            job.finished = True
            self.send(job.owner, m.event_done(
                job_id, text="".join(job.tokens), finish_reason="stop", prompt_tokens=3,
                completion_tokens=len(job.tokens), queued_s=0.0, ttft_s=0.01, total_s=0.02,
                preemptions=0))
