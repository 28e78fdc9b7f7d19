"""Metric observations as values, so pure code can say what happened without a registry.

The scheduler core returns these in its ``Effects`` (and the embedding broker makes them
as it serves); the process that hosts the code hands them to
:class:`uniun.actors.metrics.MetricSink`, which feeds prometheus-client. Keeping them as
plain values keeps the core free of I/O and lets a unit test read exactly what would
have been counted. ``name`` is a metric of :data:`uniun.actors.metrics.CATALOGUE`
without its ``uniun_`` prefix; ``labels`` are (name, value) pairs in the metric's label
order.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Count", "Sample", "Level", "Observation", "Labels"]

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Count:
    """A counter went up by ``n``."""

    name: str
    labels: Labels = ()
    n: float = 1.0


@dataclass(frozen=True, slots=True)
class Sample:
    """One observation of a histogram (seconds, tokens, ...)."""

    name: str
    value: float
    labels: Labels = ()


@dataclass(frozen=True, slots=True)
class Level:
    """A gauge is now ``value``."""

    name: str
    value: float
    labels: Labels = ()


Observation = Count | Sample | Level
