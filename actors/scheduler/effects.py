"""What the scheduler core asks the world to do, as values.

The core (:mod:`uniun.actors.scheduler.core`) never writes a file or a socket. Each input
it handles returns an :class:`Effects`: journal writes, messages for clients, commands for
the runner, and the time it wants to be woken. The actor that hosts it applies them in one
fixed order, which is where the scheduler's promises live:

1. **journal writes first**, in one transaction (persist before acknowledging: a client
   never hears of a job, a token or an end the journal does not hold);
2. then the **messages** to clients, in order;
3. then the **runner commands**, in order (a ``Load`` before the ``Start`` it serves);
4. last the metric **observations** (values for prometheus-client; nothing waits on them).

Because they are values, a unit test can check those promises without a disk or a socket,
and the host can batch the journal writes of many inputs into one commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from uniun.actors.observe import Observation
from uniun.actors.timeline import Mark, Segment
from uniun.protocol import runner_records as rp
from uniun.protocol.jobmap import JobSpec

__all__ = ["Effects", "Send", "JournalWrite", "JAccept", "JStarted", "JToken", "JPaused",
           "JFinish", "JCancelAsked", "KEEP_TIMER"]


@dataclass(frozen=True, slots=True)
class Send:
    """One protocol map (a reply or a job event) for the client connection ``conn``."""

    conn: bytes
    msg: dict[str, Any]


@dataclass(frozen=True, slots=True)
class JAccept:
    """A job was accepted (write before its ``accepted`` reply goes out)."""

    spec: JobSpec
    at: float  # unix seconds
    owner: str | None = None  # the CURVE key that submitted it


@dataclass(frozen=True, slots=True)
class JStarted:
    """A job's segment started with this effective seed."""

    job_id: str
    seed: int
    at: float


@dataclass(frozen=True, slots=True)
class JToken:
    """Token ``seq`` of a job was generated (write before it is streamed)."""

    job_id: str
    seq: int
    token_id: int
    text: str
    at: float


@dataclass(frozen=True, slots=True)
class JPaused:
    """A job was paused; ``preemptions`` is its new count."""

    job_id: str
    preemptions: int


@dataclass(frozen=True, slots=True)
class JFinish:
    """A job ended with its terminal event (write before the event goes out)."""

    job_id: str
    final: dict[str, Any]
    at: float


@dataclass(frozen=True, slots=True)
class JCancelAsked:
    """A running job's cancel was acknowledged; it ends when the runner stops it.

    Written before the ``cancelled`` reply goes out, so that a scheduler restarted in
    between ends the job ``cancelled`` on replay instead of running it on to ``done``:
    a client told "cancelled" never sees another ending.
    """

    job_id: str


# The timeline's records (a stretch that ended, an instant) are journal writes as they are.
JournalWrite = Union[JAccept, JStarted, JToken, JPaused, JFinish, JCancelAsked, Segment, Mark]


class _KeepTimer:
    """``Effects.wake_at`` when the input says nothing about the timer."""

    def __repr__(self) -> str:
        return "KEEP_TIMER"


KEEP_TIMER: Any = _KeepTimer()


@dataclass
class Effects:
    """The outputs of one input; see the module docstring for the order they apply in."""

    journal: list[JournalWrite] = field(default_factory=list)
    sends: list[Send] = field(default_factory=list)
    commands: list[rp.Command] = field(default_factory=list)
    wake_at: float | None | _KeepTimer = KEEP_TIMER  # policy-clock time; None: no timer
    # Metric values for the host's MetricSink, applied after the rest (nothing waits on them)
    observations: list[Observation] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.journal or self.sends or self.commands or self.observations
                    or self.wake_at is not KEEP_TIMER)

    def extend(self, other: "Effects") -> "Effects":
        """Append ``other`` (its timer, if it set one, wins)."""
        self.journal.extend(other.journal)
        self.sends.extend(other.sends)
        self.commands.extend(other.commands)
        self.observations.extend(other.observations)
        if other.wake_at is not KEEP_TIMER:
            self.wake_at = other.wake_at
        return self
