"""The one liveness rule every heartbeat in the runtime follows.

The ZeroMQ guide's Paranoid Pirate: peers send a heartbeat every ``interval_s``; a peer
from which nothing arrived for ``misses`` intervals is dead. The runner link, the runner
and the supervisor all judge their peers by this rule (with the intervals and misses of
``[supervisor]`` in the config), so "how long until a dead process is noticed" has one
answer: ``interval_s * misses`` (default 3 s).

A peer about to be deaf and dumb for a known while (the runner loading a model: parsing a
large ``tokenizer.json`` holds Python's GIL for seconds, so no thread of it can beat)
says so first: its last beat carries ``quiet_s``, and the silence allowed after that beat
grows by as much (:meth:`Liveness.heard`), at most :data:`MAX_QUIET_S`. Ordinary beats
(or other messages) heard in that while do not shorten it: one can leave between the
announcement and the silence itself, and ending the allowance then would take the peer
for hung in the middle of the load it announced.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Liveness", "HEARTBEAT_S", "MISSES", "MAX_QUIET_S"]

HEARTBEAT_S = 1.0  # default heartbeat interval, seconds
MISSES = 3  # default: a peer silent for this many intervals is dead
MAX_QUIET_S = 600.0  # the most a beat's announced quiet period may add, seconds


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

    @staticmethod
    def heard(at: float, quiet_s: object = 0.0, previous: float | None = None) -> float:
        """The ``last_heard`` to record for a beat that arrived ``at``, announcing
        ``quiet_s`` seconds of silence to come (anything but a number >= 0 counts as 0);
        never earlier than the ``previous`` one (an announced silence still running)."""
        if isinstance(quiet_s, bool) or not isinstance(quiet_s, (int, float)) \
                or not quiet_s > 0:
            now = at
        else:
            now = at + min(float(quiet_s), MAX_QUIET_S)
        return now if previous is None else max(previous, now)
