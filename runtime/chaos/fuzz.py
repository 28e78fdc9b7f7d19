"""A property-based wire fuzzer: hostile frames against a running scheduler's front.

What it checks (docs/fuzzing.md), frame by frame, on one DEALER connection:

- every request with a valid id gets exactly one reply carrying that ``re``, and every
  frame without one (garbage, several frames, a hostile id) exactly one reply without
  ``re``; no reply for an id twice, none for an id never sent;
- every error code, in replies and in job events alike, is in docs/protocol.md's table;
- ``internal`` never appears (``internal`` means "our bug", and hostile input is not one);
- the scheduler's pid (``status.processes.scheduler``) is the same at the end.

Frames come from Hypothesis (``fuzz_frames.drafts``), seeded, with shrinking off: against
a live server a run is a sample, not a search for a minimal example, and its frame count
must be exactly what was asked. Each frame waits for its reply before the next is sent
(so "exactly one" is decidable); job events that arrive meanwhile are checked too.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq

from uniun.protocol.errors import ErrorCode
from uniun.runtime.chaos.fuzz_frames import Draft, drafts

__all__ = ["FuzzReport", "run_wire_fuzz"]

CODES = frozenset(c.value for c in ErrorCode)
REPLY_TIMEOUT_S = 30.0  # generous: a slow shared machine under a running job
MAX_VIOLATIONS = 50  # kept in the report; the count goes on


@dataclass
class FuzzReport:
    """What a run saw. ``ok`` only if no property was violated."""

    frames: int = 0
    seed: int = 0
    replies: Counter[str] = field(default_factory=Counter)  # reply type or error code
    event_codes: Counter[str] = field(default_factory=Counter)  # codes of job error events
    labels: Counter[str] = field(default_factory=Counter)  # what kinds of frames were sent
    violations: list[str] = field(default_factory=list)
    violation_count: int = 0
    scheduler_pid_before: int | None = None
    scheduler_pid_after: int | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.violation_count == 0

    def violate(self, what: str) -> None:
        self.violation_count += 1
        if len(self.violations) < MAX_VIOLATIONS:
            self.violations.append(what)

    def to_json(self) -> dict[str, Any]:
        return {"frames": self.frames, "seed": self.seed, "ok": self.ok,
                "seconds": round(self.seconds, 1),
                "replies": dict(self.replies.most_common()),
                "event_codes": dict(self.event_codes.most_common()),
                "labels": dict(self.labels.most_common()),
                "violation_count": self.violation_count, "violations": self.violations,
                "scheduler_pid": [self.scheduler_pid_before, self.scheduler_pid_after]}

    def text(self) -> str:
        lines = [f"{self.frames} frames, seed {self.seed}, {self.seconds:.1f} s: "
                 f"{'OK' if self.ok else f'{self.violation_count} VIOLATIONS'}",
                 f"scheduler pid {self.scheduler_pid_before} -> {self.scheduler_pid_after}",
                 "replies (type, or error code):"]
        lines += [f"  {k:<22} {v}" for k, v in self.replies.most_common()]
        if self.event_codes:
            lines.append("job error events (code):")
            lines += [f"  {k:<22} {v}" for k, v in self.event_codes.most_common()]
        lines += [f"violation: {v}" for v in self.violations]
        return "\n".join(lines)


class _Conn:
    """The fuzzer's DEALER, sorting what arrives into replies and job events."""

    def __init__(self, endpoint: str, report: FuzzReport, socket_options: dict[int, Any]) -> None:
        self._ctx: zmq.Context = zmq.Context.instance()
        self.sock = self._ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        for opt, value in socket_options.items():
            self.sock.setsockopt(opt, value)
        self.sock.connect(endpoint)
        self.report = report
        self.answered: set[str] = set()  # ids a reply came for
        self.sent_ids: set[str] = set()
        self.anonymous = 0  # replies without re, not yet matched to a frame
        self.counting = False  # our own status and reset requests stay out of the histogram

    def close(self) -> None:
        self.sock.close(0)

    def _take(self, frame: bytes) -> dict[str, Any] | None:
        rep = self.report
        try:
            msg = msgpack.unpackb(frame, raw=False)
        except Exception as err:  # noqa: BLE001 - the server sent something undecodable
            rep.violate(f"undecodable server frame: {err}")
            return None
        if not isinstance(msg, dict):
            rep.violate(f"server message is not a map: {msg!r:.80}")
            return None
        code = msg.get("code")
        if msg.get("type") == "error" and (code not in CODES or code == ErrorCode.INTERNAL.value):
            rep.violate(f"error code {code!r} ({msg.get('message')!r:.120}) for {msg!r:.200}")
        re = msg.get("re")
        if re is None and isinstance(msg.get("job_id"), str) and msg.get("type") in (
                "started", "token", "paused", "done", "error"):
            if msg.get("type") == "error":
                rep.event_codes[str(code)] += 1
            return None  # a job event
        if self.counting:
            rep.replies[str(code) if msg.get("type") == "error" else str(msg.get("type"))] += 1
        if re is None:
            self.anonymous += 1
        elif re not in self.sent_ids:
            rep.violate(f"reply for an id never sent: {msg!r:.200}")
        elif re in self.answered:
            rep.violate(f"a second reply for {re!r}: {msg!r:.200}")
        else:
            self.answered.add(re)
        return msg

    def pump(self, timeout_s: float) -> None:
        """Read what arrives for up to ``timeout_s``, returning at the first reply."""
        if self.sock.poll(int(timeout_s * 1000)):
            while True:
                try:
                    self._take(self.sock.recv(zmq.NOBLOCK))
                except zmq.Again:
                    return

    def exchange(self, draft: Draft, mid: str) -> None:
        """Send one draft and wait for the one reply it is due."""
        if draft.raw is not None:
            parts: list[bytes] = list(draft.raw)
        else:
            msg = draft.msg
            if draft.wants_id:
                msg = {**msg, "id": mid}
                self.sent_ids.add(mid)
            parts = [msgpack.packb(msg, use_bin_type=True)]
        self.sock.send_multipart(parts)
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while time.monotonic() < deadline:
            if draft.wants_id and mid in self.answered:
                return
            if not draft.wants_id and self.anonymous > 0:
                self.anonymous -= 1
                return
            self.pump(0.5)
        self.report.violate(f"no reply within {REPLY_TIMEOUT_S:.0f} s to {draft.label} "
                            f"{(draft.msg if draft.raw is None else draft.raw)!r:.200}")

    def request(self, mtype: str, mid: str, **body: Any) -> dict[str, Any] | None:
        """A well-formed request of our own (status, resets); its reply, or None."""
        self.sent_ids.add(mid)
        self.sock.send(msgpack.packb({"v": 1, "type": mtype, "id": mid, **body}))
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.sock.poll(500):
                msg = self._take(self.sock.recv())
                if msg is not None and msg.get("re") == mid:
                    return msg
        return None


def _scheduler_pid(conn: _Conn, mid: str) -> int | None:
    status = conn.request("status", mid)
    if status is None:
        return None
    pid = (status.get("processes") or {}).get("scheduler")
    return pid if isinstance(pid, int) else None


def run_wire_fuzz(front_endpoint: str, frames: int, seed: int, *,
                  socket_options: dict[int, Any] | None = None) -> FuzzReport:
    """Send ``frames`` hostile frames to the front at ``front_endpoint``; see the module
    docstring for what is checked. ``socket_options``: e.g. CURVE keys for a TCP front.

    Leaves the scheduler's foreground and lifecycle as a fresh runtime has them.
    """
    from hypothesis import HealthCheck, Phase, given, seed as hypothesis_seed, settings

    report = FuzzReport(seed=seed)
    conn = _Conn(front_endpoint, report, socket_options or {})
    ids = (f"fz-{seed}-{n}" for n in itertools.count())
    started = time.monotonic()
    try:
        report.scheduler_pid_before = _scheduler_pid(conn, next(ids))
        if report.scheduler_pid_before is None:
            report.violate("the front did not answer status before the run")
            return report

        @hypothesis_seed(seed)
        @settings(max_examples=frames, database=None, deadline=None, derandomize=False,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck),
                  report_multiple_bugs=False)
        @given(drafts())
        def one(draft: Draft) -> None:
            if report.frames >= frames:
                return
            report.frames += 1
            report.labels[draft.label] += 1
            conn.exchange(draft, next(ids))

        conn.counting = True
        one()
        conn.counting = False
        conn.pump(1.0)  # late duplicates, if any
        conn.request("foreground", next(ids), kind=None)
        conn.request("lifecycle", next(ids), state="foreground")
        report.scheduler_pid_after = _scheduler_pid(conn, next(ids))
        if report.scheduler_pid_after != report.scheduler_pid_before:
            report.violate(f"scheduler pid changed: {report.scheduler_pid_before} -> "
                           f"{report.scheduler_pid_after}")
        if conn.anonymous:
            report.violate(f"{conn.anonymous} replies without re beyond one per frame")
    finally:
        report.seconds = time.monotonic() - started
        conn.close()
    return report
