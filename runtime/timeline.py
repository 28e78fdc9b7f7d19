"""The scheduler's timeline as a Chrome trace (Perfetto, ``chrome://tracing``).

Input: segments (a job held the runner, or waited for it) and marks (instants), the
records of ``actors/timeline.py``, from the journal
(``actors/scheduler/journal.py:read_timeline``) or from the simulator
(``actors/sim/timeline.py``). Output:
the JSON object format of the Trace Event Format, laid out as

- one process, "uniun scheduler" (or "uniun simulator");
- thread **runner**: one complete event (``ph: X``) per run segment, named
  ``kind job_id``, with tier, model, flow, tokens and the ``end`` reason in ``args``;
- threads **T0 waiting** ... **T4 waiting**: one complete event per wait segment, in
  the tier the job was dispatched from (or cancelled in). Waits of one tier overlap, and
  a trace viewer wants the slices of one thread nested, so each tier gets as many
  threads as it had jobs waiting at once ("T4 waiting", "T4 waiting #2", ...), sorted
  together;
- instant events (``ph: i``) for preempt, resume and swap on the runner thread, and
  for runner_lost, runner_up and scheduler_start across the whole process.

Times are microseconds from the first event (``otherData.origin_unix`` says when that
was for a real runtime), so a simulated run (which starts at 0) and a real one line up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from uniun.actors.timeline import PROCESS_MARKS, Mark, Segment

__all__ = ["chrome_trace", "trace_problems", "RUNNER_TID"]

RUNNER_TID = 1
_TIER_TID = 100_000  # tier t's threads are 100000*(t+1) + lane


def chrome_trace(segments: Iterable[Segment], marks: Iterable[Mark], *,
                 source: str = "uniun scheduler", origin: float | None = None
                 ) -> dict[str, Any]:
    """The trace object (``json.dump`` it). ``origin``: the time of ts 0 (default: the
    earliest segment start or mark)."""
    segments, marks = list(segments), list(marks)
    if origin is None:
        times = [s.start for s in segments] + [m.at for m in marks]
        origin = min(times) if times else 0.0

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 1)

    events: list[dict[str, Any]] = []
    threads: dict[int, str] = {RUNNER_TID: "runner"}
    lanes: dict[int, list[float]] = {}  # tier -> end time of each lane's last wait
    for seg in sorted(segments, key=lambda s: (s.start, s.end)):
        args: dict[str, Any] = {"job_id": seg.job_id, "kind": seg.kind, "flow": seg.flow,
                "tier": f"T{seg.tier}", "model": seg.model_id, "end": seg.reason}
        if seg.lane == "run":
            tid, name, cat = RUNNER_TID, f"{seg.kind} {seg.job_id}", "run"
            args["tokens"] = seg.tokens
        else:
            ends = lanes.setdefault(seg.tier, [])
            lane = next((i for i, end in enumerate(ends) if end <= seg.start), len(ends))
            if lane == len(ends):
                ends.append(seg.end)
            else:
                ends[lane] = seg.end
            tid = _TIER_TID * (seg.tier + 1) + lane
            threads[tid] = f"T{seg.tier} waiting" + (f" #{lane + 1}" if lane else "")
            name, cat = f"{seg.kind} {seg.job_id}", "wait"
        events.append({"name": name, "cat": cat, "ph": "X", "ts": us(seg.start),
                       "dur": round(max(0.0, seg.end - seg.start) * 1e6, 1), "pid": 1,
                       "tid": tid, "args": args})
    for mark in marks:
        scope = "p" if mark.what in PROCESS_MARKS or not mark.job_id else "t"
        label = mark.what if not mark.job_id else f"{mark.what} {mark.job_id}"
        events.append({"name": label, "cat": mark.what, "ph": "i", "s": scope,
                       "ts": us(mark.at), "pid": 1, "tid": RUNNER_TID,
                       "args": {"job_id": mark.job_id, "detail": mark.detail}})
    events.sort(key=lambda e: (e["ts"], e["ph"] != "X"))
    meta: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "ts": 0, "pid": 1,
                                   "tid": 0, "args": {"name": source}}]
    for tid, name in sorted(threads.items()):
        meta.append({"name": "thread_name", "ph": "M", "ts": 0, "pid": 1, "tid": tid,
                     "args": {"name": name}})
        meta.append({"name": "thread_sort_index", "ph": "M", "ts": 0, "pid": 1, "tid": tid,
                     "args": {"sort_index": tid}})
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"source": source, "origin_unix": origin,
                          "segments": len(segments), "marks": len(marks)}}


_REQUIRED = ("name", "ph", "ts", "pid", "tid")
_PHASES = set("BEXiIMbenCsftPOND")


def trace_problems(trace: Any) -> list[str]:
    """What keeps ``trace`` from being a valid Trace Event Format object (empty: valid).

    Checks the required keys of every event (name, ph, ts, pid, tid), their types, a
    known ``ph``, ``dur`` >= 0 on complete events, ``s`` of instants in g/p/t and
    ``args.name`` on name metadata.
    """
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["not an object with a traceEvents list"]
    problems: list[str] = []
    for i, ev in enumerate(trace["traceEvents"]):
        where = f"traceEvents[{i}]"
        if not isinstance(ev, dict):
            problems.append(f"{where}: not an object")
            continue
        missing = [k for k in _REQUIRED if k not in ev]
        if missing:
            problems.append(f"{where}: missing {', '.join(missing)}")
            continue
        if not isinstance(ev["name"], str) or ev["ph"] not in _PHASES:
            problems.append(f"{where}: bad name or ph {ev['ph']!r}")
        if not _number(ev["ts"]) or not isinstance(ev["pid"], int) \
                or not isinstance(ev["tid"], int):
            problems.append(f"{where}: ts must be a number, pid and tid integers")
        if ev["ph"] == "X" and not (_number(ev.get("dur")) and ev["dur"] >= 0):
            problems.append(f"{where}: a complete event needs dur >= 0")
        if ev["ph"] == "i" and ev.get("s", "t") not in ("g", "p", "t"):
            problems.append(f"{where}: instant scope must be g, p or t")
        if ev["ph"] == "M" and ev["name"] in ("process_name", "thread_name") \
                and not isinstance((ev.get("args") or {}).get("name"), str):
            problems.append(f"{where}: name metadata needs args.name")
    return problems


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def run_segments(trace: dict[str, Any]) -> Sequence[dict[str, Any]]:
    """The runner thread's slices in time order (what ran), for tests and tools."""
    return sorted((e for e in trace["traceEvents"]
                   if e.get("ph") == "X" and e.get("tid") == RUNNER_TID),
                  key=lambda e: e["ts"])
