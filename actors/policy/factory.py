"""Policies by name (selectable by config; docs/scheduling.md)."""

from __future__ import annotations

from uniun.actors.policy.base import Clock, PolicyBase
from uniun.actors.policy.config import PolicyConfig
from uniun.actors.policy.fcfs import FcfsPolicy
from uniun.actors.policy.uniun import UniunPolicy

POLICIES: dict[str, type[PolicyBase]] = {"uniun": UniunPolicy, "fcfs": FcfsPolicy}


def make_policy(name: str, config: PolicyConfig | None = None, clock: Clock | None = None,
                *, wall_clock: Clock | None = None) -> PolicyBase:
    """A fresh policy. ``clock``: policy time in seconds (default ``time.monotonic``);
    ``wall_clock``: unix seconds, to convert job deadlines (default ``time.time``)."""
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})")
    return cls(config, clock, wall_clock)
