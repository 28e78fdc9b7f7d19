"""The embedding pool's records: its settings, one request, its counters, and the
``retry_after_s`` hint. Pure data and arithmetic, no sockets (``pool.py`` is the broker).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from uniun.actors.embedding.worker import DEFAULT_MICRO_BATCH
from uniun.actors.observe import Observation
from uniun.models.convert.embedding import MODEL_ID
from uniun.models.store import ModelStore
from uniun.protocol.codec import DEFAULT_LIMITS, Limits

__all__ = ["Counters", "PoolSettings", "Request", "ServiceTime"]

SERVICE_PRIOR_S = 0.2  # a request's run time assumed until one was measured, s
SERVICE_WEIGHT = 0.2  # weight of the newest run time in the moving average
RETRY_MIN_S, RETRY_MAX_S = 0.05, 30.0  # the retry_after_s hint stays within these, s


@dataclass(frozen=True)
class PoolSettings:
    """How one pool runs. Defaults match ``[embed]`` of the runtime config.

    The folders and the worker command are the runtime's to choose: ``run_dir`` holds the
    private worker socket and the published pids, ``logs_dir`` one log per worker,
    ``worker_argv`` starts one worker process (``runtime/embed_worker_main.py``).
    """

    endpoint: str
    store: ModelStore
    run_dir: Path
    logs_dir: Path
    worker_argv: tuple[str, ...]
    workers: int = 2  # processes = requests served at once
    queue_bound: int = 64  # requests waiting at most; more get queue_full
    client_queue_bound: int = 16  # requests one connection may have waiting (0 = no cap)
    micro_batch: int = DEFAULT_MICRO_BATCH  # texts per ONNX run of a request
    model_id: str = MODEL_ID
    threads: int = 1  # ONNX Runtime threads per worker
    device_state: str = ""  # the scheduler's device-state endpoint ("" = never yield)
    max_attempts: int = 3  # runs of one request (crashes included) before `internal`
    request_timeout_s: float = 300.0  # a worker busy longer than this is killed, s
    log_level: str = "INFO"
    publish_endpoint: bool = True  # write run/embed.endpoint (false for private pools)
    limits: Limits = DEFAULT_LIMITS
    observe: Callable[[list[Observation]], None] | None = None  # MetricSink.apply
    front_setup: Callable[[zmq.Socket], None] | None = None  # before bind (CURVE on tcp)
    # After the sockets close, before the context terminates: what front_setup started on
    # this context (CURVE's ZAP authenticator) must end first, or the term waits forever.
    front_teardown: Callable[[], None] | None = None


@dataclass
class Request:
    route: list[bytes]  # ROUTER identity frames, sent back before the reply
    key: tuple[bytes, ...]  # the connection it came on (its route, hashable)
    msg_id: str
    texts: tuple[str, ...]
    rid: int
    attempts: int = 0
    arrived: float = 0.0  # monotonic seconds, for the latency metric


@dataclass
class Counters:
    accepted: int = 0
    answered: int = 0
    rejected_full: int = 0  # queue_full answers, both limits
    rejected_client: int = 0  # of those, because the connection was at its own cap
    dropped_gone: int = 0  # waiting requests dropped because their client had gone
    dropped_unread: int = 0  # replies dropped because their client was not reading
    requeued: int = 0
    failed: int = 0
    yielded: int = 0  # answered requests that waited for interactive work to end
    yield_wait_s: float = 0.0  # their total wait, s
    yield_wait_max_s: float = 0.0
    micro_batches: int = 0  # ONNX runs of answered requests
    yield_pauses: int = 0  # times a worker waited for interactive work before a run
    yield_pauses_within: int = 0  # of those, between two runs of the same request

    def add_result(self, result: dict[str, Any]) -> None:
        """What a worker's result says of its micro-batches and its waits for interactive
        work (fields it lacks or that are not numbers count nothing)."""
        for name, field in (("micro_batches", "batches"), ("yield_pauses", "pauses"),
                            ("yield_pauses_within", "pauses_within")):
            value = result.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                setattr(self, name, getattr(self, name) + value)
        waited = result.get("waited_s")
        if isinstance(waited, (int, float)) and not isinstance(waited, bool) and waited > 0.001:
            self.yielded += 1
            self.yield_wait_s += float(waited)
            self.yield_wait_max_s = max(self.yield_wait_max_s, float(waited))


class ServiceTime:
    """A moving average of how long one request runs, and the retry hint built on it."""

    def __init__(self) -> None:
        self.mean_s = SERVICE_PRIOR_S

    def add(self, ran_s: float) -> None:
        self.mean_s += SERVICE_WEIGHT * (ran_s - self.mean_s)

    def retry_after(self, *, workers: int, turns: int) -> float:
        """When a refused request would likely fit, s: a slot frees when a worker takes
        the next request (one run over the workers); one connection's slot frees when its
        turn comes round (``turns``: as many runs as connections are waiting)."""
        hint = self.mean_s * max(1, turns) / max(1, workers)
        return round(min(RETRY_MAX_S, max(RETRY_MIN_S, hint)), 3)
