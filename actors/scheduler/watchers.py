"""The clients that follow the scheduler's state: ``watch``, then ``state`` events (pure).

Why: a live view of the device (the console, ``top``) should learn what happened when it
happens, not by asking ``status`` in a loop. A client sends ``watch`` once; from then on
the scheduler pushes to it:

- the **timeline** as it is written: every segment that ends (a job ran or waited) and
  every mark (preempt, resume, swap, runner lost or up), in the same effects that
  journal them, so a preemption reaches a watcher with the ``paused`` it causes;
- the **status** snapshot, when something changed, at most every ``every_s``; a change
  inside the interval is pushed when it ends (the core asks the host to be woken then).

While a chat waits for its first token, pushes are held back (for at most ``HOLD_MAX_S``)
and go out together once it has it: what a watcher does with a push (a gateway fanning
it out, a page drawing it) runs on the cores the chat's prefill needs, and the moment a
chat preempts background work is exactly when there is most to push.

A watcher with a CURVE key sees other keys' jobs as ``status`` shows them to it (ids
hidden). Watchers are connections: one that goes away is forgotten.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from uniun.actors.scheduler.effects import Send
from uniun.actors.scheduler.status import HIDDEN
from uniun.actors.timeline import Mark, Segment
from uniun.protocol import messages as m

__all__ = ["HOLD_MAX_S", "WATCH_STATUS_S", "Watchers"]

WATCH_STATUS_S = 0.25  # shortest interval between two status pushes to watchers, s
HOLD_MAX_S = 0.3  # longest a chat's first token holds pushes back, s


class Watchers:
    """See the module docstring. ``clock``: the policy's clock (``due`` is on it)."""

    def __init__(self, clock: Callable[[], float], every_s: float = WATCH_STATUS_S) -> None:
        self._clock = clock
        self._every_s = every_s
        self._owners: dict[bytes, str | None] = {}  # connection -> its CURVE key
        self._pushed_at = float("-inf")
        self._pushed_changes = -1
        self.due: float | None = None  # when a held-back push is due
        self._held: list[Segment | Mark] = []  # records held back for a chat's first token
        self._hold_since: float | None = None

    def __bool__(self) -> bool:
        return bool(self._owners)

    def add(self, conn: bytes, owner: str | None) -> None:
        self._owners[conn] = owner
        self._pushed_changes = -1  # the newcomer gets a status at the next push

    def drop(self, conn: bytes) -> None:
        self._owners.pop(conn, None)

    def sends(self, writes: Iterable[object], changes: int,
              status: Callable[[str | None], dict[str, Any]],
              job_owner: Callable[[str], str | None], *, hold: bool = False) -> list[Send]:
        """What to push for one applied input: its timeline records, and the status
        (``status(owner)``) if it changed and the interval allows. ``job_owner``: the key
        a job belongs to (a keyed watcher sees other keys' job ids as ``HIDDEN``).
        ``hold``: a chat waits for its first token (held back up to ``HOLD_MAX_S``)."""
        if not self._owners:
            self.due, self._held, self._hold_since = None, [], None
            return []
        records = [*self._held, *(w for w in writes if isinstance(w, (Segment, Mark)))]
        now = self._clock()
        if not hold:
            self._hold_since = None
        elif self._hold_since is None:
            self._hold_since = now
        if self._hold_since is not None and now < self._hold_since + HOLD_MAX_S:
            self._held, self.due = records, self._hold_since + HOLD_MAX_S  # woken then
            return []
        self._held = []
        events: dict[str | None, dict[str, Any]] = {}
        if records:
            for owner in set(self._owners.values()):
                seen = [_fields(w, owner, job_owner) for w in records]
                events[owner] = m.event_state(
                    segments=[f for f, w in zip(seen, records) if isinstance(w, Segment)],
                    marks=[f for f, w in zip(seen, records) if isinstance(w, Mark)])
        out = [Send(conn, events[owner]) for conn, owner in self._owners.items() if events]
        if changes == self._pushed_changes:
            self.due = None
            return out
        if now - self._pushed_at < self._every_s:
            self.due = self._pushed_at + self._every_s
            return out
        self._pushed_at, self._pushed_changes, self.due = now, changes, None
        bodies: dict[str | None, dict[str, Any]] = {}
        for conn, owner in self._owners.items():
            if owner not in bodies:
                bodies[owner] = m.event_state(status=status(owner))
            out.append(Send(conn, bodies[owner]))
        return out


def _fields(record: Any, owner: str | None,
            job_owner: Callable[[str], str | None]) -> dict[str, Any]:
    """A timeline record as a map; for a keyed watcher, other keys' job ids hidden (a
    mark's detail may name the job it made way for: that part is cut)."""
    out = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    if owner is None:
        return out
    job_id = out.get("job_id")
    if job_id is not None and job_owner(job_id) != owner:
        out["job_id"] = HIDDEN
    if isinstance(out.get("detail"), str):
        out["detail"] = out["detail"].split(" for ")[0]
    return out
