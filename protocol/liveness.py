"""The one liveness rule every heartbeat in the runtime follows.

The ZeroMQ guide's Paranoid Pirate: peers send a heartbeat every ``interval_s``; a peer
from which nothing arrived for ``misses`` intervals is dead. The runner link, the runner
and the supervisor all judge their peers by this rule (with the intervals and misses of
``[supervisor]`` in the config), so "how long until a dead process is noticed" has one
answer: ``interval_s * misses`` (default 3 s).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Liveness", "HEARTBEAT_S", "MISSES"]

HEARTBEAT_S = 1.0  # default heartbeat interval, seconds
MISSES = 3  # default: a peer silent for this many intervals is dead


@dataclass(frozen=True)
class Liveness:
    interval_s: float = HEARTBEAT_S
    misses: int = MISSES

    @property
    def silence_s(self) -> float:
        """How long a peer may be silent before it counts as dead, seconds."""
        return self.interval_s * self.misses

    def dead(self, last_heard: float, now: float) -> bool:
        """Nothing heard from the peer since ``last_heard`` for longer than allowed."""
        return now - last_heard > self.silence_s
