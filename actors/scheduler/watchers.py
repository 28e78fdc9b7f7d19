"""The clients that follow the scheduler's state: ``watch``, then ``state`` events (pure).

Why: a live view of the device (the console, ``top``) should learn what happened when it
happens, not by asking ``status`` in a loop. A client sends ``watch`` once; from then on
the scheduler pushes to it:

- the **timeline** as it is written: every segment that ends (a job ran or waited) and
  every mark (preempt, resume, swap, runner lost or up), in the same effects that
  journal them, so a preemption reaches a watcher with the ``paused`` it causes;
- the **status** snapshot, when something changed, at most every ``every_s``; a change
  inside the interval is pushed when it ends (the core asks the host to be woken then).

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

__all__ = ["Watchers", "WATCH_STATUS_S"]

WATCH_STATUS_S = 0.25  # shortest interval between two status pushes to watchers, s


class Watchers:
    """See the module docstring. ``clock``: the policy's clock (``due`` is on it)."""

    def __init__(self, clock: Callable[[], float], every_s: float = WATCH_STATUS_S) -> None:
        self._clock = clock
        self._every_s = every_s
        self._owners: dict[bytes, str | None] = {}  # connection -> its CURVE key
        self._pushed_at = float("-inf")
        self._pushed_changes = -1
        self.due: float | None = None  # when a held-back status push is due

    def __bool__(self) -> bool:
        return bool(self._owners)

    def add(self, conn: bytes, owner: str | None) -> None:
        self._owners[conn] = owner
        self._pushed_changes = -1  # the newcomer gets a status at the next push

    def drop(self, conn: bytes) -> None:
        self._owners.pop(conn, None)

    def sends(self, writes: Iterable[object], changes: int,
              status: Callable[[str | None], dict[str, Any]],
              job_owner: Callable[[str], str | None]) -> list[Send]:
        """What to push for one applied input: its timeline records, and the status
        (``status(owner)``) if it changed and the interval allows. ``job_owner``: the key
        a job belongs to (a keyed watcher sees other keys' job ids as ``HIDDEN``)."""
        if not self._owners:
            self.due = None
            return []
        records = [w for w in writes if isinstance(w, (Segment, Mark))]
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
        now = self._clock()
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
