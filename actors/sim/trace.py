"""Workload traces for the simulator: one JSON object per line, time-ordered.

::

    {"t": 12.5, "event": "submit", "job": {<job map, docs/protocol.md>,
                                           "prompt_tokens": 80, "new_tokens": 128}}
    {"t": 30.0, "event": "cancel", "job_id": "..."}
    {"t": 40.0, "event": "foreground", "kind": "nataraj"}      (or null)
    {"t": 90.0, "event": "lifecycle", "state": "background"}

``t`` is seconds since the start of the trace. ``new_tokens`` is how many tokens the job
produces before it stops by itself (it stops earlier at ``max_new_tokens``). A job's
``deadline`` is read on the trace's own clock (seconds since the start), not as unix
time. The whole file is checked before anything is simulated; the first problem is
reported as :class:`TraceError` with its line number.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from uniun.protocol.errors import InvalidField
from uniun.protocol.jobmap import DEFAULT_KINDS, JobSpec, validate_job

EVENTS = ("submit", "cancel", "foreground", "lifecycle")
_EVENT_KEYS = {
    "submit": {"t", "event", "job"},
    "cancel": {"t", "event", "job_id"},
    "foreground": {"t", "event", "kind"},
    "lifecycle": {"t", "event", "state"},
}


class TraceError(ValueError):
    """A trace line that cannot be simulated; ``line`` is 1-based (0: the file)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
        self.message = message


@dataclass(frozen=True)
class Submit:
    t: float
    spec: JobSpec
    prompt_tokens: int
    new_tokens: int
    line: int = 0


@dataclass(frozen=True)
class Cancel:
    t: float
    job_id: str
    line: int = 0


@dataclass(frozen=True)
class Foreground:
    t: float
    kind: str | None
    line: int = 0


@dataclass(frozen=True)
class Lifecycle:
    t: float
    state: str
    line: int = 0


TraceEvent = Submit | Cancel | Foreground | Lifecycle


def parse_trace(lines: Iterable[str], *, default_model: str,
                kinds: tuple[str, ...] = DEFAULT_KINDS) -> list[TraceEvent]:
    """Check every line and return the events; raise :class:`TraceError` on the first
    bad line. Blank lines are skipped."""
    events: list[TraceEvent] = []
    submitted: set[str] = set()
    last_t = 0.0
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise TraceError(number, f"not JSON: {err.msg} (column {err.colno})") from None
        event = _parse_line(raw, number, default_model, kinds, submitted)
        if event.t < last_t:
            raise TraceError(number, f"t: {event.t} is before the previous line's "
                                     f"{last_t} (a trace is time-ordered)")
        last_t = event.t
        events.append(event)
    return events


def load_trace(path: Path | str, *, default_model: str,
               kinds: tuple[str, ...] = DEFAULT_KINDS) -> list[TraceEvent]:
    """Read and check a trace file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise TraceError(0, f"cannot read {path}: {err}") from None
    return parse_trace(text.splitlines(), default_model=default_model, kinds=kinds)


def _parse_line(raw: Any, line: int, default_model: str, kinds: tuple[str, ...],
                submitted: set[str]) -> TraceEvent:
    if not isinstance(raw, dict):
        raise TraceError(line, "must be a JSON object")
    t = raw.get("t")
    if not _number(t) or t < 0:
        raise TraceError(line, "t: must be a number of seconds >= 0")
    name = raw.get("event")
    if name not in EVENTS:
        raise TraceError(line, f"event: must be one of {', '.join(EVENTS)} (got {name!r})")
    unknown = sorted(set(raw) - _EVENT_KEYS[name])
    if unknown:
        raise TraceError(line, f"{unknown[0]}: unknown key for a {name} event")
    t = float(t)
    if name == "submit":
        return _parse_submit(raw.get("job"), t, line, default_model, kinds, submitted)
    if name == "cancel":
        job_id = raw.get("job_id")
        if not isinstance(job_id, str) or not job_id:
            raise TraceError(line, "job_id: must be a non-empty string")
        if job_id not in submitted:
            raise TraceError(line, f"job_id: {job_id!r} was not submitted earlier")
        return Cancel(t, job_id, line)
    if name == "foreground":
        if "kind" not in raw:
            raise TraceError(line, "kind: is required (a kind or null)")
        kind = raw["kind"]
        if kind is not None and kind not in kinds:
            raise TraceError(line, f"kind: must be null or one of {', '.join(kinds)}")
        return Foreground(t, kind, line)
    state = raw.get("state")
    if state not in ("foreground", "background"):
        raise TraceError(line, "state: must be \"foreground\" or \"background\"")
    return Lifecycle(t, state, line)


def _parse_submit(job: Any, t: float, line: int, default_model: str,
                  kinds: tuple[str, ...], submitted: set[str]) -> Submit:
    if not isinstance(job, dict):
        raise TraceError(line, "job: must be a job map")
    counts = {}
    for key, least in (("prompt_tokens", 0), ("new_tokens", 1)):
        value = job.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise TraceError(line, f"job.{key}: must be an integer >= {least}")
        counts[key] = value
    wire = {k: v for k, v in job.items() if k not in counts}
    try:
        spec = validate_job(wire, default_model=default_model, kinds=kinds)
    except InvalidField as err:
        raise TraceError(line, f"job.{err.message}") from None
    if spec.job_id in submitted:
        raise TraceError(line, f"job.job_id: {spec.job_id!r} is submitted twice")
    submitted.add(spec.job_id)
    return Submit(t, spec, counts["prompt_tokens"], counts["new_tokens"], line)


def _number(value: Any) -> TypeGuard[float]:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
