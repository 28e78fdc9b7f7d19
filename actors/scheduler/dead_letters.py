"""Dead letters: acknowledged jobs that a journal replay could not bring back.

A client that was told ``accepted`` was promised its job is kept. When a restarted
scheduler cannot use a journaled job — its kind is no longer in ``[jobs] kinds``, or
its row cannot be decoded — the journal moves the row (raw bytes and tokens) to its
``dead_letters`` table with the reason instead of deleting it (``journal.py``). This
module is what the scheduler core knows of them: ``status`` reports the count and the
newest few, and an ``attach`` of such a job answers ``not_found`` naming the reason
instead of a bare "no job". No I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["DeadLetter", "DeadLetters", "SHOWN_IN_STATUS"]

SHOWN_IN_STATUS = 5  # the newest dead letters listed in ``status`` (the count is all)


@dataclass(frozen=True)
class DeadLetter:
    """One job moved aside at replay. ``at``: unix seconds when it was moved; ``kind``
    and ``owner`` (its CURVE key) when the row still says them."""

    job_id: str
    reason: str
    at: float
    kind: str | None = None
    owner: str | None = None

    def summary(self) -> dict[str, Any]:
        """The job as ``status`` lists it (no owner: status never shows keys)."""
        return {"job_id": self.job_id, "kind": self.kind, "reason": self.reason,
                "at": self.at}


class DeadLetters:
    """The dead letters the journal holds: every one by job id (newest wins: a job id
    may be submitted again after its first job was moved aside), and their total."""

    def __init__(self, letters: Iterable[DeadLetter] = (), count: int | None = None) -> None:
        ordered = sorted(letters, key=lambda d: d.at)
        self._by_id = {d.job_id: d for d in ordered}
        self._newest = ordered[-SHOWN_IN_STATUS:][::-1]
        self.count = len(ordered) if count is None else count

    def get(self, job_id: str, owner: str | None) -> DeadLetter | None:
        """The dead letter of ``job_id`` if ``owner`` may see it (another key's job is
        as good as unknown, as for live jobs)."""
        found = self._by_id.get(job_id)
        return found if found is not None and found.owner == owner else None

    def status(self) -> dict[str, Any] | None:
        """``{count, recent}`` for ``status`` (newest first); None while there are none."""
        if not self.count:
            return None
        return {"count": self.count, "recent": [d.summary() for d in self._newest]}
