"""The schema fuzzer: hostile JSON Schemas through every door a schema comes in by.

Each generated schema (``schema_drafts.hostile_schemas``) is sent three ways, each
waiting for its answer before the next:

- ``response_format``: ``POST /v1/chat/completions`` with ``{"type": "json_schema",
  "json_schema": {"name": ..., "schema": <it>}}``;
- ``tools``: the same route with one function tool whose ``parameters`` is the schema,
  ``tool_choice: "required"`` (the tool-call grammar embeds it);
- ``wire``: a protocol ``submit`` whose job has ``format: {"type": "json_schema",
  "schema": <it>}``, on a DEALER, then the job's events to its end.

And asserts, per answer: HTTP 4xx (an OpenAI error object, nothing internal) or a 200
with a chat completion; over the wire an ``error`` reply with a table code (never
``internal``) or an accepted job that ends ``done``. Throughout: ``GET /health`` answers
200 after every schema, and the scheduler's, runner's and gateway's pids are the same at
the end as at the start (no process died). Requests are small (``max_tokens`` 3), so an
accepted schema costs a few tokens of the model.

Hypothesis draws, seeded, shrinking off, as the other fuzzers (a run is a sample).
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq

from uniun.protocol.errors import ErrorCode
from uniun.runtime.chaos.http_drafts import HttpDraft, Target
from uniun.runtime.chaos.http_fuzz import HttpFuzzReport, check_reply
from uniun.runtime.chaos.http_wire import exchange

__all__ = ["SchemaFuzzReport", "run_schema_fuzz"]

REPLY_TIMEOUT_S = 60.0  # generous: a slow shared machine
ROUTES = ("response_format", "tools", "wire")
CODES = frozenset(c.value for c in ErrorCode)


@dataclass
class SchemaFuzzReport:
    """What a run saw; ``ok`` only if no property was violated."""

    schemas: int = 0
    seed: int = 0
    http: HttpFuzzReport = field(default_factory=HttpFuzzReport)  # both HTTP routes
    outcomes: Counter[str] = field(default_factory=Counter)  # "route family answer"
    wire_codes: Counter[str] = field(default_factory=Counter)
    pids_before: dict[str, int | None] = field(default_factory=dict)
    pids_after: dict[str, int | None] = field(default_factory=dict)
    health_failures: int = 0
    seconds: float = 0.0

    @property
    def violations(self) -> list[str]:
        return self.http.violations

    @property
    def violation_count(self) -> int:
        return self.http.violation_count

    @property
    def ok(self) -> bool:
        return self.violation_count == 0

    @property
    def deaths(self) -> int:
        return sum(self.pids_before.get(name) != pid for name, pid in self.pids_after.items())

    def to_json(self) -> dict[str, Any]:
        return {"schemas": self.schemas, "requests": self.schemas * len(ROUTES),
                "seed": self.seed, "ok": self.ok, "seconds": round(self.seconds, 1),
                "process_deaths": self.deaths, "pids_before": self.pids_before,
                "pids_after": self.pids_after, "health_failures": self.health_failures,
                "http_statuses": {str(k): v for k, v in sorted(self.http.statuses.items())},
                "http_error_codes": dict(self.http.codes.most_common()),
                "wire_codes": dict(self.wire_codes.most_common()),
                "outcomes": dict(sorted(self.outcomes.items())),
                "violation_count": self.violation_count, "violations": self.violations}

    def text(self) -> str:
        lines = [f"{self.schemas} schemas x {len(ROUTES)} routes, seed {self.seed}, "
                 f"{self.seconds:.1f} s: "
                 f"{'OK' if self.ok else f'{self.violation_count} VIOLATIONS'}",
                 f"process deaths {self.deaths} (pids {self.pids_before} -> "
                 f"{self.pids_after}), /health failures {self.health_failures}",
                 "answers (route family answer):"]
        lines += [f"  {k:<40} {v}" for k, v in sorted(self.outcomes.items())]
        lines += [f"violation: {v}" for v in self.violations]
        return "\n".join(lines)


def _post(t: Target, path: str, body: bytes, label: str) -> HttpDraft:
    headers = [(b"Host", b"127.0.0.1:%d" % t.port), (b"Content-Type", b"application/json"),
               (b"Content-Length", str(len(body)).encode()), (b"Connection", b"close")]
    if t.api_key:
        headers.append((b"Authorization", b"Bearer " + t.api_key.encode()))
    return HttpDraft(label, b"POST", path.encode(), tuple(headers), body)


def _dumps(value: Any) -> bytes | None:
    try:
        return json.dumps(value).encode()
    except (RecursionError, ValueError):
        return None  # deeper than Python's JSON encoder goes: no client can send it either


def _chat(t: Target, schema: Any, route: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": t.chat_model, "max_tokens": 3,
                            "messages": [{"role": "user", "content": "Fill it in."}]}
    if route == "response_format":
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "fuzzed", "schema": schema}}
    else:
        body["tools"] = [{"type": "function", "function": {
            "name": "fuzzed", "description": "a fuzzed tool", "parameters": schema}}]
        body["tool_choice"] = "required"
    return body


class _Wire:
    """One DEALER for the wire route: a submit, its reply, and the job's end."""

    def __init__(self, endpoint: str, socket_options: dict[int, Any]) -> None:
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        for opt, value in socket_options.items():
            self.sock.setsockopt(opt, value)
        self.sock.connect(endpoint)
        self.ids = itertools.count()

    def close(self) -> None:
        self.sock.close(0)

    def call(self, msg: dict[str, Any] | None, until: Any) -> dict[str, Any] | None:
        """Send ``msg`` (if any), then read until a message satisfies ``until``."""
        if msg is not None:
            self.sock.send(msgpack.packb(msg, use_bin_type=True))  # a frame too deep or
            # too wide to decode is answered without ``re`` (it has no readable id)
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.sock.poll(500):
                reply = msgpack.unpackb(self.sock.recv(), raw=False)
                if isinstance(reply, dict) and until(reply):
                    return reply
        return None

    def status(self) -> dict[str, Any] | None:
        mid = f"sf-status-{next(self.ids)}"
        return self.call({"v": 1, "type": "status", "id": mid}, lambda r: r.get("re") == mid)

    def pids(self) -> dict[str, int | None]:
        status = self.status() or {}
        procs = status.get("processes") or {}
        return {name: procs.get(name) for name in ("scheduler", "runner", "http")}


def _wire_route(report: SchemaFuzzReport, wire: _Wire, t: Target, family: str,
                schema: Any) -> None:
    n = next(wire.ids)
    mid, job_id = f"sf-{report.seed}-{n}", f"sf-job-{report.seed}-{n}"
    job = {"job_id": job_id, "kind": "chat", "prompt": "Fill it in.", "max_new_tokens": 3,
           "format": {"type": "json_schema", "schema": schema}}
    try:
        msgpack.packb(job)
    except (ValueError, OverflowError, TypeError):
        report.outcomes[f"wire {family} unencodable"] += 1  # msgpack cannot carry it
        return
    reply = wire.call({"v": 1, "type": "submit", "id": mid, "job": job}, lambda r: r.get(
        "re") == mid or (r.get("re") is None and r.get("type") == "error" and "job_id" not in r))
    if reply is None:
        report.http.violate(f"wire: no reply to the submit of a {family} schema")
        return
    if reply.get("type") == "error":
        code = str(reply.get("code"))
        report.wire_codes[code] += 1
        report.outcomes[f"wire {family} {code}"] += 1
        if code not in CODES or code == ErrorCode.INTERNAL.value:
            report.http.violate(f"wire: error code {code!r} for a {family} schema: "
                                f"{reply.get('message')!r:.200}")
        return
    end = wire.call(None, lambda r: r.get("job_id") == job_id
                    and r.get("type") in ("done", "error"))
    outcome = "done" if end is not None and end.get("type") == "done" else \
        f"ended {None if end is None else end.get('code')}"
    report.outcomes[f"wire {family} {outcome}"] += 1
    if outcome != "done":
        report.http.violate(f"wire: an accepted {family} job {outcome}: {end!r:.300}")


def _health(report: SchemaFuzzReport, t: Target) -> None:
    reply = exchange(t.host, t.port, _get_health(t).raw(), timeout_s=REPLY_TIMEOUT_S)
    if reply.status != 200:
        report.health_failures += 1
        report.http.violate(f"/health answered {reply.status} ({reply.problem})")


def _get_health(t: Target) -> HttpDraft:
    return HttpDraft("health", b"GET", b"/health",
                     ((b"Host", b"127.0.0.1:%d" % t.port), (b"Connection", b"close")))


def _http_route(report: SchemaFuzzReport, t: Target, family: str, schema: Any,
                route: str, markers: tuple[str, ...]) -> None:
    body = _dumps(_chat(t, schema, route))
    if body is None:
        report.outcomes[f"{route} {family} unencodable"] += 1
        return
    draft = _post(t, "/v1/chat/completions", body, f"{route}:{family}")
    reply = exchange(t.host, t.port, draft.raw(), timeout_s=REPLY_TIMEOUT_S)
    check_reply(report.http, draft, reply, markers)
    report.outcomes[f"{route} {family} {reply.status}"] += 1
    if reply.status == 200:
        try:
            choices = json.loads(reply.body)["choices"]
            assert isinstance(choices, list) and choices
        except (ValueError, KeyError, TypeError, AssertionError):
            report.http.violate(f"{route}: a 200 that is no chat completion: "
                                f"{reply.body[:200]!r}")


def run_schema_fuzz(target: Target, front_endpoint: str, schemas: int, seed: int, *,
                    socket_options: dict[int, Any] | None = None,
                    markers: tuple[str, ...] = ()) -> SchemaFuzzReport:
    """Send ``schemas`` hostile schemas through the three routes; see the module
    docstring for what is checked."""
    from hypothesis import HealthCheck, Phase, given, seed as hypothesis_seed, settings

    from uniun.runtime.chaos.schema_drafts import hostile_schemas

    report = SchemaFuzzReport(seed=seed)
    wire = _Wire(front_endpoint, socket_options or {})
    started = time.monotonic()
    try:
        report.pids_before = wire.pids()

        @hypothesis_seed(seed)
        @settings(max_examples=schemas, database=None, deadline=None, derandomize=False,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck),
                  report_multiple_bugs=False)
        @given(hostile_schemas())
        def one(drawn: tuple[str, Any]) -> None:
            if report.schemas >= schemas:
                return
            report.schemas += 1
            family, schema = drawn
            for route in ROUTES[:2]:
                _http_route(report, target, family, schema, route, markers)
            _wire_route(report, wire, target, family, schema)
            _health(report, target)

        one()
        report.pids_after = wire.pids()
        for name, pid in report.pids_after.items():
            if pid != report.pids_before.get(name):
                report.http.violate(f"{name} pid changed: {report.pids_before.get(name)} -> "
                                    f"{pid}")
    finally:
        report.seconds = time.monotonic() - started
        wire.close()
    return report
