"""A journaled job read back at replay: a :class:`JournalEntry`, or why it cannot be.

Acknowledged means kept (``journal.py``): a spec is re-checked for its shape only, with
the size limits lifted to what the row needs, so a limit lowered since the job was
accepted does not lose it. What decodes but cannot run under today's configuration (a
live job of a kind no longer configured) raises :class:`Unschedulable`; anything
undecodable raises whatever decoding raised. The journal moves either to its dead
letters.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

import msgpack

from uniun.protocol.jobmap import JobSpec, validate_job

__all__ = ["JournalEntry", "Unschedulable", "entry_of"]

NO_LIMIT = 2**62  # a size limit lifted: the row passed the one it was accepted under


@dataclass
class JournalEntry:
    """One journaled job as replayed after a restart."""

    spec: JobSpec
    accepted_at: float
    seed: int | None = None
    started: bool = False
    preemptions: int = 0
    started_at: float | None = None
    first_token_at: float | None = None
    token_ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    final: dict[str, Any] | None = None
    cancel_asked: bool = False  # a cancel was acknowledged: replay ends it cancelled
    owner: str | None = None  # the CURVE key that submitted it


class Unschedulable(Exception):
    """A journaled job that decodes but that today's configuration cannot run (its kind
    is no longer configured): the reason it is dead-lettered."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.kind = kind


def _accepted_limits(raw: dict[Any, Any], max_new_tokens_cap: int) -> dict[str, int]:
    """The size limits to re-check a journaled spec with: none it could fail. It passed
    the limits of the configuration it was accepted under, and a lower limit today must
    not drop an acknowledged job; the shape checks still apply."""
    asked = raw.get("max_new_tokens")
    row_needs = asked if isinstance(asked, int) and not isinstance(asked, bool) else 0
    return {"max_new_tokens_cap": max(max_new_tokens_cap, row_needs),
            "max_prompt_chars": NO_LIMIT}


def entry_of(db: sqlite3.Connection, row: tuple[Any, ...], *, default_model: str,
              kinds: tuple[str, ...], max_new_tokens_cap: int) -> JournalEntry:
    """One replayed job from its ``jobs`` row and its tokens; raises on anything
    undecodable or of the wrong type, and :class:`Unschedulable` for a live job of a
    kind that is no longer configured (the caller moves the row to the dead letters)."""
    (job_id, blob, accepted_at, seed, was_started, preemptions, started_at,
     first_token_at, final, cancel_asked, owner) = row
    raw = msgpack.unpackb(blob, raw=False)
    if not isinstance(raw, dict):
        raise TypeError(f"spec is a {type(raw).__name__}, not a map")
    kind = raw.get("kind")
    spec = validate_job(raw, default_model=default_model,
                        kinds=(*kinds, kind) if isinstance(kind, str) else kinds,
                        **_accepted_limits(raw, max_new_tokens_cap))
    if spec.job_id != job_id:
        raise ValueError(f"spec names job {spec.job_id!r}")
    # An ended job (or one whose cancel was acknowledged) never runs again: its kind
    # need not be configured for its outcome to be kept.
    if final is None and not cancel_asked and spec.kind not in kinds:
        raise Unschedulable(f"kind {spec.kind!r} is not in [jobs] kinds any more",
                            spec.kind)
    entry = JournalEntry(spec=spec, accepted_at=float(accepted_at),
                         seed=None if seed is None else int(seed),
                         started=bool(was_started), preemptions=int(preemptions),
                         started_at=None if started_at is None else float(started_at),
                         first_token_at=(None if first_token_at is None
                                         else float(first_token_at)),
                         cancel_asked=bool(cancel_asked),
                         owner=owner if isinstance(owner, str) else None)
    if final is not None:
        outcome = msgpack.unpackb(final, raw=False)
        if not isinstance(outcome, dict):
            raise TypeError(f"outcome is a {type(outcome).__name__}, not a map")
        entry.final = outcome
        return entry
    for token_id, text in db.execute(
            "SELECT token_id, text FROM tokens WHERE job_id = ? ORDER BY seq", (job_id,)):
        if not isinstance(token_id, int) or not isinstance(text, str):
            raise TypeError("a token row is not (integer, text)")
        entry.token_ids.append(token_id)
        entry.texts.append(text)
    return entry
