"""What the chaos clients saw of every job: submits, acknowledgements, every event.

Pure bookkeeping (no I/O, no clock of its own: callers pass times), so the verdict's
rules can be tested on hand-made histories. One :class:`JobHistory` per job id; events
for a job id nobody submitted are kept apart as ``strays``.

Redelivery is not duplication: after a scheduler restart the wire re-attaches with
``after_seq`` and an ended job's terminal event comes again. An identical terminal
event is a redelivery; terminal events that disagree, a token ``seq`` that comes twice,
or a second from-scratch ``started`` after tokens were streamed are duplications.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["JobHistory", "Ledger"]



@dataclass
class JobHistory:
    """One job as the clients saw it."""

    job_id: str
    kind: str
    template: str  # key of the fault-free reference text
    submitted_at: float
    stream: bool = True
    acked_at: float | None = None
    rejected: dict[str, Any] | None = None  # the error reply to the submit, if any
    tokens: dict[int, str] = field(default_factory=dict)
    token_repeats: int = 0  # a seq delivered again (same text)
    token_conflicts: int = 0  # a seq delivered again with another text
    starts: list[bool] = field(default_factory=list)  # `resumed` of each started
    terminals: list[dict[str, Any]] = field(default_factory=list)  # distinct ones
    redeliveries: int = 0  # identical terminal events again (after a re-attach)
    fresh_restarts: int = 0  # a started resumed=false after tokens had streamed
    faults_seen: set[str] = field(default_factory=set)  # fault kinds while it was open

    @property
    def acked(self) -> bool:
        return self.acked_at is not None

    @property
    def ended(self) -> bool:
        return bool(self.terminals)

    @property
    def last_seq(self) -> int:
        return max(self.tokens) if self.tokens else -1

    @property
    def final(self) -> dict[str, Any] | None:
        return self.terminals[0] if self.terminals else None

    def streamed_text(self) -> str:
        return "".join(self.tokens[s] for s in sorted(self.tokens))

    def gap_free(self) -> bool:
        """Token seqs 0..n-1 with none missing (and, if done, n = completion tokens)."""
        if list(sorted(self.tokens)) != list(range(len(self.tokens))):
            return False
        final = self.final
        if final is not None and final.get("type") == "done" and self.stream:
            usage = final.get("usage") or {}
            if usage.get("completion_tokens") != len(self.tokens):
                return False
            if not str(final.get("text", "")).startswith(self.streamed_text()):
                return False
        return True


class Ledger:
    """Every job's :class:`JobHistory`, by id."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobHistory] = {}
        self.strays: list[dict[str, Any]] = []  # events of job ids nobody submitted
        self.odd_replies: list[dict[str, Any]] = []  # replies to requests we did not send

    def submitted(self, job: dict[str, Any], template: str, now: float) -> JobHistory:
        hist = self.jobs.get(job["job_id"])
        if hist is None:
            hist = JobHistory(job["job_id"], job["kind"], template, now,
                              stream=job.get("stream", True))
            self.jobs[hist.job_id] = hist
        return hist

    def accepted(self, job_id: str, now: float) -> None:
        hist = self.jobs.get(job_id)
        if hist is not None and hist.acked_at is None:
            hist.acked_at = now

    def rejected(self, job_id: str, reply: dict[str, Any]) -> None:
        hist = self.jobs.get(job_id)
        if hist is not None and not hist.acked:
            hist.rejected = reply

    def event(self, msg: dict[str, Any]) -> None:
        """A job event (``started``, ``token``, ``paused``, ``done``, ``error``)."""
        hist = self.jobs.get(str(msg.get("job_id")))
        if hist is None:
            self.strays.append(msg)
            return
        kind = msg.get("type")
        if kind == "token":
            seq, text = int(msg.get("seq", -1)), str(msg.get("text", ""))
            if seq in hist.tokens:
                if hist.tokens[seq] == text:
                    hist.token_repeats += 1
                else:
                    hist.token_conflicts += 1
            else:
                hist.tokens[seq] = text
        elif kind == "started":
            resumed = bool(msg.get("resumed"))
            if not resumed and hist.tokens:
                hist.fresh_restarts += 1
            hist.starts.append(resumed)
        elif kind in ("done", "error"):
            if any(_same(t, msg) for t in hist.terminals):
                hist.redeliveries += 1
            else:
                hist.terminals.append(msg)

    def fault(self, kind: str) -> None:
        """A fault of ``kind`` happened now: every open job lived through it."""
        for hist in self.jobs.values():
            if not hist.ended and hist.rejected is None:
                hist.faults_seen.add(kind)

    def open_jobs(self) -> list[JobHistory]:
        """Acknowledged (or not yet answered) jobs without a terminal event."""
        return [h for h in self.jobs.values() if not h.ended and h.rejected is None]


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("type", "code", "text", "finish_reason", "usage")
    return all(a.get(k) == b.get(k) for k in keys)
