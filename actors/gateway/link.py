"""The gateway's side of protocol v1: jobs through pooled ``Client``s in worker threads.

Theory of operation. The HTTP server is asynchronous (one event loop); the protocol
clients are blocking and not thread-safe. So each HTTP request that runs a job gets a
worker thread for the job's life, and that thread borrows a ``Client`` from a small pool
(connections are reused; a client that failed is closed, not returned). The thread
submits, then reads the job's events and hands each to the event loop
(``call_soon_threadsafe``), where the request's handler turns them into JSON or SSE.
A blocked read returns as soon as a frame arrives (a ZeroMQ poll), so this adds well
under a millisecond per token.

Cancellation: the handler calls :meth:`JobRun.cancel` when the HTTP client went away;
the worker notices within :data:`POLL_S`, sends ``cancel`` for the job (on the same
client, the one it owns) and ends. Across a scheduler restart the client reconnects and
re-attaches by itself, so a request sees a pause, not an error; only a submit still
unanswered at a second restart is given up, as ``poisoned`` (protocol/client.py; the
HTTP answer is a 422, errors.py).

The embedding pool is served the same way, with a pool of ``EmbedClient``s.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from loguru import logger

from uniun.protocol.client import Client, ClientError, SchedulerUnavailable, Timeout
from uniun.protocol.codec import EncodeError
from uniun.protocol.curve import ClientCurve
from uniun.protocol.embed_client import EmbedClient

__all__ = ["POLL_S", "ClientPool", "JobRun", "Outcome", "SchedulerLink"]

POLL_S = 0.1  # how often a worker waiting for events looks at its cancel flag, s
MAX_IDLE_CLIENTS = 8  # connections kept open between requests
CALL_THREADS = 8  # threads for short calls: status for /health, embedding requests

C = TypeVar("C")


class ClientPool(Generic[C]):
    """Idle clients to reuse; one borrower at a time each (they are not thread-safe)."""

    def __init__(self, make: Callable[[], C], max_idle: int = MAX_IDLE_CLIENTS) -> None:
        self._make = make
        self._idle: list[C] = []
        self._lock = threading.Lock()
        self._max_idle = max_idle
        self._closed = False

    def acquire(self) -> C:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._make()

    def release(self, client: C, *, healthy: bool) -> None:
        with self._lock:
            if healthy and not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(client)
                return
        client.close()  # type: ignore[attr-defined]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for client in idle:
            client.close()  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Outcome:
    """One thing the worker reports to the event loop, in order.

    ``kind``: ``accepted`` (``data`` = the reply), ``event`` (a job event map),
    ``refused`` (``error`` = the ClientError of the submit), ``unavailable`` (no
    scheduler), ``cancelled`` (we cancelled it), ``end`` (always last).
    """

    kind: str
    data: dict[str, Any] | None = None
    error: Exception | None = None


class JobRun:
    """One job, submitted and followed by a worker thread; read it with :meth:`next`."""

    def __init__(self, link: SchedulerLink, job: dict[str, Any],
                 loop: asyncio.AbstractEventLoop) -> None:
        self.job = job
        self.job_id: str = job["job_id"]
        self._link = link
        self._loop = loop
        self._queue: asyncio.Queue[Outcome] = asyncio.Queue()
        self._cancel = threading.Event()

    async def next(self) -> Outcome:
        return await self._queue.get()

    def cancel(self) -> None:
        """Cancel the job (the HTTP client went away); idempotent, returns at once."""
        self._cancel.set()

    def _push(self, outcome: Outcome) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, outcome)
        except RuntimeError:  # the loop closed (shutdown): nobody is listening any more
            self._cancel.set()

    def run(self) -> None:
        """The worker thread's body."""
        if self._link.closed:
            self._push(Outcome("unavailable", error=SchedulerUnavailable("gateway stopping")))
            self._push(Outcome("end"))
            return
        log = logger.bind(job=self.job_id)
        client = self._link.clients.acquire()
        healthy = True
        try:
            healthy = self._follow(client, log)
        except Exception as err:  # our bug, or a client in a bad state: report, drop it
            log.exception("gateway worker failed")
            self._push(Outcome("unavailable", error=err))
            healthy = False
        finally:
            self._link.clients.release(client, healthy=healthy)
            self._link.runs.discard(self)
            self._push(Outcome("end"))

    def _follow(self, client: Client, log: Any) -> bool:
        try:
            stream = client.submit(self.job)
        except ClientError as err:
            self._push(Outcome("refused", error=err))
            return True
        except EncodeError as err:  # the handler checks first (body.carriable); a net
            self._push(Outcome("refused", error=ClientError("bad_envelope", str(err))))
            return True
        except (SchedulerUnavailable, Timeout) as err:
            self._push(Outcome("unavailable", error=err))
            return False
        self._push(Outcome("accepted", data=stream.accepted))
        while True:
            if self._cancel.is_set():
                try:
                    client.cancel(self.job_id)
                    log.info("cancelled: the HTTP client went away")
                except ClientError:
                    pass  # it had ended already
                self._push(Outcome("cancelled"))
                return True
            try:
                event = stream.next_event(timeout=POLL_S)
            except Timeout:
                continue
            except ClientError as err:  # a re-attach refused after a scheduler restart
                self._push(Outcome("refused", error=err))
                return True
            except SchedulerUnavailable as err:
                self._push(Outcome("unavailable", error=err))
                return False
            if event is None:
                return True
            self._push(Outcome("event", data=event))
            if event["type"] in ("done", "error"):
                return True


class SchedulerLink:
    """The scheduler and the embedding pool, as the gateway's handlers use them."""

    def __init__(self, front: str, embed: str | None, *, max_workers: int,
                 timeout_s: float = 10.0, front_curve: ClientCurve | None = None,
                 embed_curve: ClientCurve | None = None) -> None:
        self.front = front
        self.clients: ClientPool[Client] = ClientPool(
            lambda: Client(front, timeout=timeout_s, curve=front_curve))
        self.embed_clients: ClientPool[EmbedClient] | None = (
            ClientPool(lambda: EmbedClient(embed, timeout=60.0, curve=embed_curve))
            if embed else None)
        # Jobs hold a thread for their whole life; short calls (status, embed) get their
        # own threads so a full house of streams never starves /health.
        self._executor = ThreadPoolExecutor(max_workers=max_workers,
                                            thread_name_prefix="gateway-job")
        self._calls = ThreadPoolExecutor(max_workers=CALL_THREADS,
                                         thread_name_prefix="gateway-call")
        self.runs: set[JobRun] = set()  # jobs whose worker has not ended
        self.closed = False

    def start_job(self, job: dict[str, Any]) -> JobRun:
        run = JobRun(self, job, asyncio.get_running_loop())
        self.runs.add(run)
        self._executor.submit(run.run)
        return run

    async def call(self, fn: Callable[[Client], Any]) -> Any:
        """Run ``fn(client)`` (status, ping) on a pooled client in a worker thread."""
        def work() -> Any:
            client = self.clients.acquire()
            healthy = False
            try:
                result = fn(client)
                healthy = True
                return result
            finally:
                self.clients.release(client, healthy=healthy)
        return await asyncio.get_running_loop().run_in_executor(self._calls, work)

    async def embed(self, texts: list[str]) -> Any:
        """``[n, dim]`` vectors from the pool (raises ClientError / EmbedUnavailable)."""
        pool = self.embed_clients
        if pool is None:
            raise SchedulerUnavailable("the embedding pool is not enabled ([embed] enabled)")

        def work() -> Any:
            client = pool.acquire()
            healthy = False
            try:
                vectors = client.embed(texts)
                healthy = True
                return vectors
            except ClientError:
                healthy = True  # a refusal (queue_full): the connection is fine
                raise
            finally:
                pool.release(client, healthy=healthy)
        return await asyncio.get_running_loop().run_in_executor(self._calls, work)

    def close(self) -> None:
        """Cancel every open job (their workers end within ``POLL_S``), close clients."""
        self.closed = True
        for run in list(self.runs):
            run.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._calls.shutdown(wait=False, cancel_futures=True)
        self.clients.close()
        if self.embed_clients is not None:
            self.embed_clients.close()
