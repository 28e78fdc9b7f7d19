"""A property-based HTTP fuzzer: hostile requests against a running gateway, with a verdict.

What it checks, request by request (each on a connection of its own, ``Connection:
close``, so an answer is decidable):

- every request is answered (a status line came back before the timeout);
- no answer has a 5xx status: a malformed or hostile request is a client's mistake;
- every 4xx answer is an OpenAI error object, ``{"error": {"message": str, "type": str,
  "param": str|null, "code": str|null}}``, with nothing internal in it (no traceback, no
  endpoint, no path of the runtime's home);
- a request the door must refuse (foreign ``Host`` or ``Origin``, a body that is not
  ``application/json``) is never answered 2xx;
- a streamed answer carries no error event (a job that failed after acceptance);
- the gateway's resident memory does not grow past a budget over the run (sampled from
  ``/proc``; the fuzzer runs on the runtime's machine).

Requests come from Hypothesis (``http_drafts``), seeded, shrinking off: against a live
server a run is a sample, and its request count must be exactly what was asked.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uniun.runtime.chaos.http_drafts import HttpDraft, Target, http_drafts
from uniun.runtime.chaos.http_wire import Reply, exchange

__all__ = ["HttpFuzzReport", "error_object_problem", "internal_text", "run_http_fuzz"]

REPLY_TIMEOUT_S = 60.0  # generous: a slow shared machine with background work running
MAX_VIOLATIONS = 50  # kept in the report; the count goes on
RSS_EVERY = 250  # requests between RSS samples
RSS_BUDGET_MB = 64.0  # growth of the gateway's RSS over the run, after a warm-up, MB
WARMUP = 200  # requests before the RSS baseline (imports, pools and caches fill first)
_INTERNAL = re.compile(r"Traceback|File \"|ipc://|tcp://|inproc://|\.py\b|"
                       r"\b[A-Z][A-Za-z]*(Error|Exception)\b")


def internal_text(text: str, markers: Sequence[str] = ()) -> str | None:
    """The first thing in ``text`` a client must not see, or None."""
    found = _INTERNAL.search(text)
    if found:
        return found.group(0)
    for marker in markers:
        if marker and marker in text:
            return marker
    return None


def error_object_problem(body: bytes) -> str | None:
    """Why ``body`` is not an OpenAI error object, or None if it is one."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return f"not JSON: {body[:120]!r}"
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict):
        return f"no error object: {body[:120]!r}"
    if not isinstance(error.get("message"), str) or not isinstance(error.get("type"), str):
        return f"error.message / error.type not strings: {body[:160]!r}"
    for key in ("param", "code"):
        if key not in error or not (error[key] is None or isinstance(error[key], str)):
            return f"error.{key} missing or not a string or null: {body[:160]!r}"
    return None


def rss_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class HttpFuzzReport:
    """What a run saw. ``ok`` only if no property was violated."""

    requests: int = 0
    seed: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)  # error.code of 4xx answers
    layers: Counter[str] = field(default_factory=Counter)  # which layer was hostile
    violations: list[str] = field(default_factory=list)
    violation_count: int = 0
    five_xx: int = 0
    unanswered: int = 0
    door_open: int = 0  # 2xx to a request the door must refuse
    bad_error_bodies: int = 0
    internal_leaks: int = 0
    stream_errors: int = 0
    gateway_pid: list[int | None] = field(default_factory=lambda: [None, None])
    rss_mb: list[tuple[int, float]] = field(default_factory=list)  # (requests, MB)
    rss_baseline_mb: float | None = None
    rss_budget_mb: float = RSS_BUDGET_MB
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.violation_count == 0

    @property
    def rss_growth_mb(self) -> float | None:
        if self.rss_baseline_mb is None or not self.rss_mb:
            return None
        return max(mb for _, mb in self.rss_mb) - self.rss_baseline_mb

    def violate(self, what: str) -> None:
        self.violation_count += 1
        if len(self.violations) < MAX_VIOLATIONS:
            self.violations.append(what)

    def to_json(self) -> dict[str, Any]:
        growth = self.rss_growth_mb
        return {"requests": self.requests, "seed": self.seed, "ok": self.ok,
                "seconds": round(self.seconds, 1),
                "responses_5xx": self.five_xx, "unanswered": self.unanswered,
                "door_refusals_answered_2xx": self.door_open,
                "error_bodies_not_openai": self.bad_error_bodies,
                "internal_text_in_answers": self.internal_leaks,
                "error_events_in_streams": self.stream_errors,
                "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "error_codes": dict(self.codes.most_common()),
                "layers": dict(self.layers.most_common()),
                "gateway_pid": self.gateway_pid,
                "gateway_rss_mb": {"baseline": self.rss_baseline_mb,
                                   "samples": self.rss_mb,
                                   "growth": None if growth is None else round(growth, 1),
                                   "budget": self.rss_budget_mb},
                "violation_count": self.violation_count, "violations": self.violations}

    def text(self) -> str:
        growth = self.rss_growth_mb
        head = (f"{self.requests} requests, seed {self.seed}, {self.seconds:.1f} s: "
                f"{'OK' if self.ok else f'{self.violation_count} VIOLATIONS'}")
        counts = (f"5xx answers {self.five_xx}, unanswered {self.unanswered}, door "
                  f"refusals answered 2xx {self.door_open}, error bodies not OpenAI "
                  f"{self.bad_error_bodies}, internal text {self.internal_leaks}, error "
                  f"events in streams {self.stream_errors}")
        memory = (f"gateway pid {self.gateway_pid[0]} -> {self.gateway_pid[1]}, RSS "
                  f"baseline {self.rss_baseline_mb} MB, growth "
                  f"{'?' if growth is None else f'{growth:.1f}'} MB (budget "
                  f"{self.rss_budget_mb:g})")
        lines = [head, counts, memory, "statuses:"]
        lines += [f"  {k:<6} {v}" for k, v in sorted(self.statuses.items())]
        lines.append("error codes:")
        lines += [f"  {k:<26} {v}" for k, v in self.codes.most_common()]
        lines += [f"violation: {v}" for v in self.violations]
        return "\n".join(lines)


def check_reply(report: HttpFuzzReport, draft: HttpDraft, reply: Reply,
                markers: Sequence[str] = ()) -> None:
    """Every property of one answer; violations go into ``report``."""
    what = f"{draft.label} {draft.raw()[:160]!r}"
    if reply.status is None:
        report.unanswered += 1
        report.violate(f"no answer ({reply.problem}) to {what}")
        return
    report.statuses[reply.status] += 1
    text = reply.body.decode("utf-8", "replace")
    if reply.status >= 500:
        report.five_xx += 1
        report.violate(f"{reply.status} {text[:200]!r} to {what}")
    if reply.status >= 400 and not draft.is_head:
        problem = error_object_problem(reply.body)
        if problem:
            report.bad_error_bodies += 1
            report.violate(f"{reply.status}: {problem} to {what}")
        else:
            report.codes[str(json.loads(reply.body)["error"].get("code"))] += 1
    if 200 <= reply.status < 300 and draft.door_refuses:
        report.door_open += 1
        report.violate(f"{reply.status}: the door should have refused {what}")
    if 200 <= reply.status < 300 and reply.headers.get("content-type", "").startswith(
            "text/event-stream") and '"error"' in text:
        report.stream_errors += 1
        report.violate(f"error event in a 200 stream {text[-300:]!r} to {what}")
    leak = internal_text(text, markers) if reply.status >= 300 else None
    if leak:
        report.internal_leaks += 1
        report.violate(f"internal text {leak!r} in {reply.status} {text[:200]!r} to {what}")
    elif reply.problem:
        report.violate(f"{reply.status} answer, but {reply.problem}, to {what}")


def run_http_fuzz(target: Target, requests: int, seed: int, *,
                  gateway_pid: int | None = None, markers: Sequence[str] = (),
                  rss_budget_mb: float = RSS_BUDGET_MB,
                  pid_after: Any = None) -> HttpFuzzReport:
    """Send ``requests`` hostile requests to the gateway ``target``; see the module
    docstring. ``markers``: strings no answer may contain (the runtime's home path).
    ``pid_after``: a callable returning the gateway's pid at the end (a restart shows)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    report = HttpFuzzReport(seed=seed, rss_budget_mb=rss_budget_mb)
    report.gateway_pid[0] = gateway_pid
    started = time.monotonic()
    warmup = min(WARMUP, requests // 10)

    @hypothesis_seed(seed)
    @settings(max_examples=requests, database=None, deadline=None, derandomize=False,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck),
              report_multiple_bugs=False)
    @given(http_drafts(target))
    def one(draft: HttpDraft) -> None:
        if report.requests >= requests:
            return
        report.requests += 1
        report.layers[draft.label.split(":")[0]] += 1
        reply = exchange(target.host, target.port, draft.raw(), timeout_s=REPLY_TIMEOUT_S,
                         head_only=draft.is_head)
        check_reply(report, draft, reply, markers)
        n = report.requests
        if n == warmup:
            report.rss_baseline_mb = rss_mb(gateway_pid)
        if n > warmup and (n % RSS_EVERY == 0 or n == requests):
            mb = rss_mb(gateway_pid)
            if mb is not None:
                report.rss_mb.append((n, round(mb, 1)))

    try:
        one()
    finally:
        report.seconds = time.monotonic() - started
    report.gateway_pid[1] = pid_after() if pid_after is not None else gateway_pid
    if gateway_pid is not None and report.gateway_pid[1] != gateway_pid:
        report.violate(f"the gateway restarted: pid {gateway_pid} -> {report.gateway_pid[1]}")
    growth = report.rss_growth_mb
    if growth is not None and growth > rss_budget_mb:
        report.violate(f"the gateway's RSS grew {growth:.1f} MB (budget {rss_budget_mb:g})")
    return report
