"""What the console's live feed holds and sends: the timeline window and the SSE frames.

Pure (no I/O, no clock: callers pass the times). :class:`TimelineWindow` keeps the
segments and marks of the last ``window_s`` seconds, from two sources that overlap: the
journal's rows read once when the gateway starts following the scheduler (the backfill)
and the ``state`` pushes of its ``watch`` (docs/protocol.md). A record can come from
both, so records are keyed by what identifies them and kept once. A new console gets
the window as its first frame; every later push is sent to it as it comes.

Why a window in the gateway rather than each page reading the journal: the journal is
read once per subscription of the gateway, not once per browser, and the page's first
frame is a bounded size however long the runtime has been up (``max_records``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MAX_RECORDS", "TimelineWindow", "mark_key", "segment_key", "sse_frame"]

MAX_RECORDS = 4000  # segments (and, apart, marks) kept in the window at most
SEGMENT_FIELDS = ("job_id", "lane", "kind", "flow", "tier", "model_id", "start", "end",
                  "reason", "tokens")
MARK_FIELDS = ("what", "at", "job_id", "detail")


def segment_key(seg: Mapping[str, Any]) -> tuple[Any, ...]:
    """A segment is one job's stretch in one lane: (job, lane, start) names it."""
    return (seg.get("job_id"), seg.get("lane"), round(float(seg.get("start") or 0.0), 6))


def mark_key(mark: Mapping[str, Any]) -> tuple[Any, ...]:
    return (mark.get("what"), mark.get("job_id"), round(float(mark.get("at") or 0.0), 6))


def _record(source: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    """A timeline record (a journal dataclass or a pushed map) as a plain map."""
    if isinstance(source, Mapping):
        return {f: source.get(f) for f in fields}
    return {f: getattr(source, f, None) for f in fields}


class TimelineWindow:
    """Segments and marks whose time is within ``window_s`` of the newest ``now`` seen."""

    def __init__(self, window_s: float, max_records: int = MAX_RECORDS) -> None:
        self.window_s = window_s
        self.max_records = max_records
        self._segments: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._marks: dict[tuple[Any, ...], dict[str, Any]] = {}

    def clear(self) -> None:
        self._segments.clear()
        self._marks.clear()

    def add(self, segments: Iterable[Any] = (), marks: Iterable[Any] = ()) -> int:
        """Keep these records (journal rows or pushed maps); returns how many were new."""
        new = 0
        for source in segments:
            seg = _record(source, SEGMENT_FIELDS)
            key = segment_key(seg)
            new += key not in self._segments
            self._segments[key] = seg
        for source in marks:
            mark = _record(source, MARK_FIELDS)
            key = mark_key(mark)
            new += key not in self._marks
            self._marks[key] = mark
        return new

    def trim(self, now: float) -> None:
        """Forget what ended before ``now - window_s``, and the oldest beyond the cap."""
        low = now - self.window_s
        self._segments = _newest({k: s for k, s in self._segments.items()
                                  if float(s["end"] or 0.0) >= low},
                                 "end", self.max_records)
        self._marks = _newest({k: m for k, m in self._marks.items()
                               if float(m["at"] or 0.0) >= low}, "at", self.max_records)

    def segments(self) -> list[dict[str, Any]]:
        return sorted(self._segments.values(), key=lambda s: (s["start"], s["end"]))

    def marks(self) -> list[dict[str, Any]]:
        return sorted(self._marks.values(), key=lambda m: m["at"])


def _newest(records: dict[tuple[Any, ...], dict[str, Any]], field: str,
            cap: int) -> dict[tuple[Any, ...], dict[str, Any]]:
    if len(records) <= cap:
        return records
    kept = sorted(records.items(), key=lambda kv: float(kv[1][field] or 0.0))[-cap:]
    return dict(kept)


def sse_frame(data: Mapping[str, Any]) -> bytes:
    """One SSE event carrying ``data`` as JSON (the page reads its ``type`` field)."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)
    return b"data: " + text.encode("utf-8") + b"\n\n"
