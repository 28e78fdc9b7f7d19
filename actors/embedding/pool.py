"""The embedding pool: a ROUTER for clients, N worker processes, a bounded queue.

Why it stands apart (docs/embeddings.md):
embedding must never block, preempt or be preempted by the chat path, so it has its
own socket, its own processes and its own model, and it never talks to the scheduler.

Theory of operation (the ZeroMQ guide's load-balancing broker, with the pool as the
parent of its workers):

- The **front** is a ROUTER bound at ``embed.endpoint`` (default
  ``ipc://$UNIUN_HOME/run/embed.sock``, written to ``run/embed.endpoint``), with the
  envelope rules of docs/protocol.md: codec limits, ``v``, ``type``, ``id``/``re``, error codes.
  Requests: ``embed {texts}`` -> ``embeddings {dim, vectors}``, ``ping`` -> ``pong``,
  and ``status`` -> ``status {workers, processes, queued, running, ...}`` (an extension).
- The **back** is a ROUTER on a private ipc socket; every worker is a child process
  (``worker.py``) with a DEALER. A worker runs one request at a time, so at most
  ``workers`` requests run at once; the rest wait, at most ``queue_bound`` of them and
  at most ``client_queue_bound`` of one connection; one more is answered ``queue_full``
  (retryable, with a ``retry_after_s`` hint) at once, never silently dropped. Waiting
  requests are taken round-robin across connections (``fair_queue.py``), so a flooding
  client gets its share of the workers and no more.
- A worker embeds a request ``micro_batch`` texts per ONNX run and checks the device
  state before each run (``worker.py``), so interactive work waits for one micro-batch,
  not for a whole request.
- **Gone peers**: the front is ``ROUTER_MANDATORY``, so a reply to a client that has
  disconnected fails instead of vanishing; the pool then drops that client's waiting
  requests instead of computing answers nobody will read.
- **Crash safety**: the pool polls its children every tick. A worker that exits (crash,
  OOM, SIGKILL) is restarted, and the request it held goes back to the *front* of the
  queue, so nothing accepted is lost. A request that kills ``max_attempts`` workers in a
  row is answered ``internal`` instead of killing workers forever. A worker busy longer
  than ``request_timeout_s`` is SIGKILLed and handled the same way. A worker that dies
  before it is ready backs off exponentially (0.5 s doubling, at most 30 s).
- The model is made ready (``ensure_model``: converted from the wheel if absent) in a
  thread after the front is bound: requests queue meanwhile; if it cannot be made,
  queued and new requests get ``unknown_model`` with the reason, and it is retried.

Invariant: every request is at any moment in exactly one place: the queue, one
worker's ``request`` slot, or answered.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

import zmq
from loguru import logger

from uniun.actors.embedding.fair_queue import FairQueue
from uniun.actors.embedding.model_gate import ModelGate
from uniun.actors.embedding.pool_state import Counters, PoolSettings, Request, ServiceTime
from uniun.actors.embedding.worker import EXIT_MODEL, INTERNAL_LIMITS
from uniun.actors.embedding.workers import PIDS_FILE, WorkerProcess, publish_pids
from uniun.actors.observe import Count, Observation, Sample
from uniun.protocol import messages as m
from uniun.protocol import requests as rq
from uniun.protocol.codec import EncodeError, encode, try_decode
from uniun.protocol.endpoints import EMBED, remove_endpoint, write_endpoint
from uniun.protocol.errors import ErrorCode, ProtocolError

POLL_MS = 100  # loop tick: how often children are checked when no message arrives, ms
DRAIN = 256  # messages read from one socket per tick before looking at the other
# Frames ZeroMQ holds unread per client connection; past it ZeroMQ stops reading that
# connection (the client's sends wait), so a client cannot park more than this in the pool.
FRONT_RCVHWM = 64
UNREAD_LOG_S = 5.0  # replies dropped for clients that do not read: logged this often, s
STOP_GRACE_S = 3.0  # running requests get this long to finish on stop, s
ALLOWED = frozenset({m.EMBED, m.PING, m.STATUS})

__all__ = ["EmbedPool", "PoolSettings"]


class EmbedPool:
    """The broker. ``run(stop)`` serves until ``stop`` is set; one thread drives it."""

    def __init__(self, settings: PoolSettings) -> None:
        if (settings.workers < 1 or settings.queue_bound < 0
                or settings.client_queue_bound < 0 or settings.micro_batch < 1):
            raise ValueError("an embedding pool needs workers >= 1, queue_bound >= 0, "
                             "client_queue_bound >= 0 and micro_batch >= 1")
        self.s = settings
        self.rules = rq.JobRules(default_model=settings.model_id)
        self.queue: FairQueue[Request] = FairQueue(settings.queue_bound,
                                                    settings.client_queue_bound)
        self.service = ServiceTime()
        self._unread_logged = -UNREAD_LOG_S
        self.workers = [WorkerProcess(f"embed-{i}") for i in range(settings.workers)]
        self.counters = Counters()
        self.endpoint = settings.endpoint
        self.dim: int | None = None
        self._rid = 0
        self.model = ModelGate(settings.store, settings.model_id)
        self._ctx = zmq.Context()
        self.front = self._ctx.socket(zmq.ROUTER)
        self.back = self._ctx.socket(zmq.ROUTER)
        self._back_path = settings.run_dir / f"embed-workers-{os.getpid()}.sock"
        self._published: dict[str, int] = {}
        self.last_tick = time.monotonic()  # the loop's heartbeat, for the health check

    # -- life ---------------------------------------------------------------------------
    def bind(self) -> str:
        """Bind both sockets and publish the front endpoint; returns it."""
        self.s.run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.s.run_dir, 0o700)
        self.front.setsockopt(zmq.LINGER, 1000)
        self.front.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a gone client fails the send
        # Frames between the protocol limit and this are read and answered bad_envelope;
        # only absurd ones make ZeroMQ drop the connection.
        self.front.setsockopt(zmq.MAXMSGSIZE, 16 * self.s.limits.frame_bytes)
        self.front.setsockopt(zmq.RCVHWM, FRONT_RCVHWM)
        if self.s.front_setup is not None:  # e.g. CURVE for a tcp endpoint
            self.s.front_setup(self.front)
        self.front.bind(self.s.endpoint)
        self.endpoint = self.front.getsockopt_string(zmq.LAST_ENDPOINT)
        self.back.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.back.setsockopt(zmq.LINGER, 0)
        self.back.bind(f"ipc://{self._back_path}")
        if self.s.publish_endpoint:
            write_endpoint(self.endpoint, EMBED)
        logger.info("embedding pool at {} ({} workers, queue bound {}, {} per connection, "
                    "{} texts per micro-batch)", self.endpoint, self.s.workers,
                    self.s.queue_bound, self.s.client_queue_bound, self.s.micro_batch)
        return self.endpoint

    def run(self, stop: threading.Event) -> int:
        """Serve until ``stop`` is set, then stop the workers and answer what is left."""
        if not self.front.getsockopt_string(zmq.LAST_ENDPOINT):
            self.bind()
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.back, zmq.POLLIN)
        try:
            while not stop.is_set():
                self.last_tick = time.monotonic()
                events = dict(poller.poll(POLL_MS))
                if self.back in events:
                    self._drain(self.back, self._on_worker_message)
                if self.front in events:
                    self._drain(self.front, self._on_client_frames)
                self._tick()
        finally:
            self._shutdown()
        return 0

    def _drain(self, sock: zmq.Socket, handle: Any) -> None:
        for _ in range(DRAIN):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                handle(frames)
            except Exception:  # noqa: BLE001 - a bug of ours must not fail every queued request
                logger.exception("failed to handle a message; carrying on")

    # -- clients --------------------------------------------------------------------------
    def _on_client_frames(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            return  # no identity: nothing to answer to
        route, payload = frames[:-1], frames[-1]
        msg = try_decode(payload, self.s.limits)
        if isinstance(msg, ProtocolError):
            self._reply(route, m.reply_error(None, msg))
            return
        re = rq.reply_to(msg)
        try:
            req = rq.parse_request(msg, self.rules, allowed=ALLOWED)
        except ProtocolError as err:
            self._reply(route, m.reply_error(re, err))
            return
        if isinstance(req, rq.Ping):
            self._reply(route, m.reply_pong(req.id))
        elif isinstance(req, rq.StatusRequest):
            self._reply(route, m.reply_status(req.id, self.status()))
        elif isinstance(req, rq.Embed):
            self._admit(route, req)

    def _admit(self, route: list[bytes], req: rq.Embed) -> None:
        if self.model.error is not None:
            err = self.model.unavailable()
            self._observe(err.code.value)
            self._reply(route, m.reply_error(req.id, err))
            return
        key = tuple(route)
        refusal = None if self._idle_worker() else self.queue.refusal(key)
        if refusal is not None:
            self.counters.rejected_full += 1
            self.counters.rejected_client += refusal.limit == "client"
            self._observe(ErrorCode.QUEUE_FULL.value)
            if refusal.limit == "client":
                text = (f"this connection has {refusal.waiting} embedding requests waiting, "
                        f"the most one connection may have; retry later")
            else:
                text = (f"embedding queue is full ({refusal.waiting} waiting, "
                        f"{self._running()} running); retry later")
            turns = self.queue.connections if refusal.limit == "client" else 1
            hint = self.service.retry_after(workers=self.s.workers, turns=turns)
            self._reply(route, m.reply_error(req.id, ProtocolError(
                ErrorCode.QUEUE_FULL, text, retry_after_s=hint)))
            return
        self._rid += 1
        self.counters.accepted += 1
        self.queue.push(key, Request(route, key, req.id, req.texts, self._rid,
                                      arrived=time.monotonic()))
        self._dispatch()

    def _reply(self, route: list[bytes], msg: dict[str, Any]) -> None:
        try:
            frame = encode(msg, self.s.limits)
        except EncodeError as exc:
            logger.error("cannot encode reply {}: {}", msg.get("type"), exc)
            frame = encode(m.reply_error(msg.get("re"), ProtocolError(
                ErrorCode.INTERNAL, "the reply does not fit in one frame; send fewer texts")))
        try:
            self.front.send_multipart([*route, frame], zmq.NOBLOCK)
        except zmq.Again:  # its outgoing queue is full: it has stopped reading
            self.counters.dropped_unread += 1
            now = time.monotonic()
            if now - self._unread_logged >= UNREAD_LOG_S:
                self._unread_logged = now
                logger.warning("a client is not reading its replies; dropped a {} reply "
                               "({} dropped so far)", msg.get("type"),
                               self.counters.dropped_unread)
        except zmq.ZMQError as exc:
            if exc.errno != errno.EHOSTUNREACH:
                raise
            self._peer_gone(tuple(route), msg)

    def _peer_gone(self, key: tuple[bytes, ...], msg: dict[str, Any]) -> None:
        """The client disconnected: its reply is lost, and nobody will read the answers
        to its waiting requests, so they are dropped instead of computed."""
        dropped = self.queue.drop(key)
        self.counters.dropped_gone += len(dropped)
        logger.info("client gone before its {} reply (re {}); dropped its {} waiting "
                    "request(s)", msg.get("type"), msg.get("re"), len(dropped))

    def _observe(self, outcome: str, req: Request | None = None) -> None:
        """Count one answered request (and its latency, when it was queued)."""
        if self.s.observe is None:
            return
        obs: list[Observation] = [Count("embed_requests", (("outcome", outcome),))]
        if req is not None:
            obs.append(Sample("embed_latency_seconds", time.monotonic() - req.arrived))
        self.s.observe(obs)

    def _answer_error(self, req: Request, err: ProtocolError) -> None:
        self.counters.failed += 1
        self._observe(err.code.value, req)
        self._reply(req.route, m.reply_error(req.msg_id, err))

    def status(self) -> dict[str, Any]:
        """The ``status`` reply body: workers, queue, counters."""
        return {"model_id": self.s.model_id, "dim": self.dim,
                "model_ready": self.model.folder is not None, "model_error": self.model.error,
                "workers": [w.summary() for w in self.workers],
                "processes": {w.name: w.pid for w in self.workers if w.pid is not None},
                "queued": len(self.queue), "running": self._running(),
                "connections_waiting": self.queue.connections,
                "queue_bound": self.s.queue_bound,
                "client_queue_bound": self.s.client_queue_bound,
                "micro_batch": self.s.micro_batch, "pid": os.getpid(),
                **vars(self.counters)}

    # -- workers --------------------------------------------------------------------------
    def _on_worker_message(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            return
        worker = next((w for w in self.workers if w.identity == frames[0]), None)
        msg = try_decode(frames[1], INTERNAL_LIMITS)
        if worker is None or isinstance(msg, ProtocolError):
            return  # a late message from a replaced incarnation, or garbage
        kind = msg.get("type")
        if kind == "ready":
            worker.state, worker.failures_in_row = "idle", 0
            self.dim = int(msg.get("dim", 0)) or self.dim
            logger.info("{} ready (pid {})", worker.name, msg.get("pid"))
        elif kind == "progress":
            if worker.request is not None and msg.get("rid") == worker.request.rid:
                done = msg.get("batches_done")
                worker.batches_done = done if isinstance(done, int) else worker.batches_done
                worker.paused = msg.get("paused") is True
            return
        elif kind in ("result", "failed"):
            req = worker.request
            if req is None or msg.get("rid") != req.rid:
                return
            ran_s = time.monotonic() - worker.busy_since
            worker.request, worker.state = None, "idle"
            if kind == "failed":
                self._answer_error(req, ProtocolError(
                    ErrorCode.INTERNAL, f"embedding failed: {msg.get('message')}"))
            else:
                self._answer_result(req, int(msg["dim"]), msg["data"])
                worker.served += 1
                self.counters.add_result(msg)
                self.service.add(ran_s)
        self._dispatch()

    def _answer_result(self, req: Request, dim: int, data: bytes) -> None:
        width = 4 * dim
        vectors = [data[i * width:(i + 1) * width] for i in range(len(req.texts))]
        self.counters.answered += 1
        self._observe("ok", req)
        self._reply(req.route, m.reply_embeddings(req.msg_id, dim, vectors))

    def _idle_worker(self) -> WorkerProcess | None:
        return next((w for w in self.workers if w.state == "idle"), None)

    def _running(self) -> int:
        return sum(1 for w in self.workers if w.request is not None)

    def _dispatch(self) -> None:
        while self.queue:
            worker = self._idle_worker()
            if worker is None:
                return
            req = self.queue.pop()
            req.attempts += 1
            worker.request, worker.state, worker.busy_since = req, "busy", time.monotonic()
            worker.batches_done, worker.paused = 0, False
            frame = encode({"type": "work", "rid": req.rid, "texts": list(req.texts)},
                           INTERNAL_LIMITS)
            try:
                self.back.send_multipart([worker.identity, frame], zmq.NOBLOCK)
            except zmq.ZMQError as exc:  # unroutable: it died between ready and now
                logger.warning("{} unreachable ({}); restarting it", worker.name, exc)
                worker.kill()

    def _tick(self) -> None:
        now = time.monotonic()
        self.model.tick(now)
        self._fail_queue_if_no_model()
        for worker in self.workers:
            code = worker.exit_code()
            if code is not None:
                self._on_exit(worker, code, now)
            elif worker.state == "busy" and now - worker.busy_since > self.s.request_timeout_s:
                logger.error("{} busy for over {:.0f} s; killing it", worker.name,
                             self.s.request_timeout_s)
                worker.kill()
            if worker.proc is None and self.model.folder is not None and now >= worker.next_start:
                worker.spawn(self.s.worker_argv, backend=f"ipc://{self._back_path}",
                             model_dir=self.model.folder, threads=self.s.threads,
                             micro_batch=self.s.micro_batch,
                             log_level=self.s.log_level, device_state=self.s.device_state,
                             log_file=self.s.logs_dir / f"{worker.name}.log")
        pids = {w.name: w.pid for w in self.workers if w.pid is not None}
        if self.s.publish_endpoint and pids != self._published:
            publish_pids(self.s.run_dir, pids)  # the scheduler's status lists embed-N from it
            self._published = pids
        self._dispatch()

    def _fail_queue_if_no_model(self) -> None:
        """With no model and no ready worker, waiting requests would wait forever."""
        if self.model.error is None or not self.queue:
            return
        if any(w.ready for w in self.workers):
            return
        err = self.model.unavailable()
        while self.queue:
            self._answer_error(self.queue.pop(), err)

    def _on_exit(self, worker: WorkerProcess, code: int, now: float) -> None:
        """A worker process ended: put its request back first in line; it restarts."""
        was_ready = worker.ready
        logger.warning("{} (pid {}) exited with code {}{}", worker.name, worker.pid, code,
                       f" while running request {worker.request.msg_id}"
                       if worker.request else "")
        req = worker.reap(now)
        if req is not None:
            if req.attempts >= self.s.max_attempts:
                self._answer_error(req, ProtocolError(
                    ErrorCode.INTERNAL, f"this request ended {req.attempts} embedding "
                    "workers; not retrying it"))
            else:
                self.counters.requeued += 1
                self.queue.push_front(req.key, req)
        if not was_ready and code == EXIT_MODEL and not any(w.ready for w in self.workers):
            self.model.failed(f"the workers cannot load it (see {worker.name}.log)", now)

    # -- stop -----------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Stop workers, let running requests finish briefly, answer the rest."""
        err = ProtocolError(ErrorCode.SHUTTING_DOWN, "the embedding pool is stopping")
        while self.queue:
            self._answer_error(self.queue.pop(), err)
        deadline = time.monotonic() + STOP_GRACE_S
        while self._running() and time.monotonic() < deadline:
            if self.back.poll(50):
                self._drain(self.back, self._on_worker_message)
            while self.queue:  # a crash during the grace period requeued something
                self._answer_error(self.queue.pop(), err)
        for worker in self.workers:
            if worker.request is not None:
                self._answer_error(worker.request, err)
                worker.request = None
            worker.terminate()
        for worker in self.workers:
            worker.wait_or_kill(STOP_GRACE_S)
        if self.s.publish_endpoint:
            remove_endpoint(EMBED, only_if=self.endpoint)
            (self.s.run_dir / PIDS_FILE).unlink(missing_ok=True)
        self.front.close(linger=1000)
        self.back.close(linger=0)
        if self.s.front_teardown is not None:
            self.s.front_teardown()
        self._ctx.term()
        self._back_path.unlink(missing_ok=True)
        if self.endpoint.startswith("ipc://"):  # libzmq leaves the file; clients check it
            Path(self.endpoint[len("ipc://"):]).unlink(missing_ok=True)
        logger.info("embedding pool stopped")
