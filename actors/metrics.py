"""The runtime's Prometheus metrics: one catalogue, and the sink that feeds it.

Every metric is named ``uniun_*`` and declared once here, so the names a user scrapes and
the names the code observes cannot drift apart (docs/observability.md lists them).
Processes do not call prometheus-client themselves: the scheduler core and the embedding
broker produce :mod:`uniun.actors.observe` values and the host of each hands them to a
:class:`MetricSink`.

Across processes the runtime uses prometheus-client's multiprocess mode: the supervisor
points ``PROMETHEUS_MULTIPROC_DIR`` of every child at ``$UNIUN_HOME/run/metrics`` (wiped
at each start), each process writes its values into small mmap files there, and the
exposition (``runtime/metrics_http.py``) merges them at scrape time. Counters of a
process that restarted keep counting from where its predecessor's files stopped; gauges
use ``mostrecent`` (the last value written by any process wins), which is right for
values only the scheduler sets. Without the variable (a unit test, metrics off) the
same metrics live in the process's memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from loguru import logger
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from uniun.actors.observe import Count, Labels, Level, Observation, Sample

__all__ = ["CATALOGUE", "MetricSink", "PREFIX"]

PREFIX = "uniun_"
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_WAIT = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)
_STEP = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 1.0)

# name (without prefix) -> (type, help, label names, buckets)
CATALOGUE: dict[str, tuple[type, str, tuple[str, ...], tuple[float, ...] | None]] = {
    "jobs_accepted": (Counter, "Jobs accepted by the scheduler.", ("kind", "tier"), None),
    "jobs_done": (Counter, "Jobs that ended with done.", ("kind", "tier"), None),
    "jobs_failed": (Counter, "Jobs that ended with an error (code: cancelled, "
                             "runner_failed, ...).", ("kind", "tier", "code"), None),
    "preemptions": (Counter, "Pauses of a running job, by reason (preempted, slice, "
                             "budget, swap).", ("reason",), None),
    "tokens_generated": (Counter, "Tokens generated, by job kind.", ("kind",), None),
    "swaps": (Counter, "Model swaps the scheduler asked for, by the model loaded.",
              ("model",), None),
    "queue_depth": (Gauge, "Jobs waiting, by tier.", ("tier",), None),
    "parked_snapshots": (Gauge, "KV snapshots parked on the runner.", (), None),
    "parked_snapshot_bytes": (Gauge, "Memory held by parked KV snapshots.", (), None),
    "chat_ttft_seconds": (Histogram, "Chat time to first token, from acceptance.", (),
                          _LATENCY),
    "queue_wait_seconds": (Histogram, "Acceptance to first dispatch, by kind.", ("kind",),
                           _WAIT),
    "pause_seconds": (Histogram, "How long a paused job waited to resume, by kind and "
                                 "pause reason.", ("kind", "reason"), _WAIT),
    "runner_step_seconds": (Histogram, "Runner time per generated token (phase first: "
                                       "the prefill or recompute before a segment's first "
                                       "token; decode: every other).", ("phase",), _STEP),
    "embed_requests": (Counter, "Embedding requests answered, by outcome (ok, or the "
                                "error code).", ("outcome",), None),
    "embed_latency_seconds": (Histogram, "Embedding request latency in the pool, "
                                         "arrival to answer.", (), _LATENCY),
}


class MetricSink:
    """Applies observations to the catalogue's metrics on ``registry`` (a private one by
    default: in multiprocess mode the values go to the shared files regardless)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._metrics: dict[str, Any] = {}
        for name, (cls, doc, labels, buckets) in CATALOGUE.items():
            kwargs: dict[str, Any] = {"labelnames": labels, "registry": self.registry}
            if buckets is not None:
                kwargs["buckets"] = buckets
            if cls is Gauge:
                kwargs["multiprocess_mode"] = "mostrecent"
            self._metrics[name] = cls(PREFIX + name, doc, **kwargs)
        self._children: dict[tuple[str, Labels], Any] = {}
        self._warned: set[str] = set()

    def apply(self, observations: Iterable[Observation]) -> None:
        for obs in observations:
            metric = self._child(obs.name, obs.labels)
            if metric is None:
                continue
            if isinstance(obs, Count):
                metric.inc(obs.n)
            elif isinstance(obs, Sample):
                metric.observe(obs.value)
            elif isinstance(obs, Level):
                metric.set(obs.value)

    def _child(self, name: str, labels: Labels) -> Any:
        key = (name, labels)
        child = self._children.get(key)
        if child is not None:
            return child
        metric = self._metrics.get(name)
        try:
            if metric is None:
                raise KeyError(f"no metric {name!r} in the catalogue")
            child = metric.labels(**dict(labels)) if labels else metric
        except (KeyError, ValueError) as err:  # our bug: say it once, keep serving
            if name not in self._warned:
                self._warned.add(name)
                logger.error("metric observation dropped: {}", err)
            return None
        self._children[key] = child
        return child
