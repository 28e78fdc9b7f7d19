"""The Chrome trace of a timeline (``runtime/timeline.py``): layout and validity, from
hand-made segments and from the simulator (``simulate --trace-out``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests import REPO
from uniun.actors.timeline import Mark, Segment
from uniun.runtime.commands.trace import parse_since
from uniun.runtime.timeline import RUNNER_TID, chrome_trace, run_segments, trace_problems


def seg(job: str, lane: str, tier: int, start: float, end: float, reason: str) -> Segment:
    kind = "chat" if tier == 0 else "nataraj"
    return Segment(job, lane, kind, kind, tier, "m", start, end, reason, 4)


PREEMPTION = [seg("bg", "wait", 4, 100.0, 100.1, "dispatched"),
              seg("bg", "run", 4, 100.1, 102.0, "preempted"),
              seg("chat", "wait", 0, 101.9, 102.0, "dispatched"),
              seg("chat", "run", 0, 102.0, 102.5, "done"),
              seg("bg", "wait", 4, 102.0, 102.5, "dispatched"),
              seg("bg", "run", 4, 102.5, 104.0, "done")]
MARKS = [Mark("preempt", 101.95, "bg", "preempted for chat"),
         Mark("resume", 102.5, "bg", "T4 after 10 tokens"),
         Mark("runner_lost", 105.0, None, "killed")]


def threads(trace: dict) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def test_the_runner_track_shows_what_ran_and_tier_tracks_what_waited() -> None:
    trace = chrome_trace(PREEMPTION, MARKS)
    assert trace_problems(trace) == []
    ran = [(e["args"]["job_id"], e["args"]["end"]) for e in run_segments(trace)]
    assert ran == [("bg", "preempted"), ("chat", "done"), ("bg", "done")]
    assert threads(trace)[RUNNER_TID] == "runner"
    waits = {threads(trace)[e["tid"]] for e in trace["traceEvents"] if e.get("cat") == "wait"}
    assert waits == {"T0 waiting", "T4 waiting"}
    first = run_segments(trace)[0]
    assert first["ts"] == 100_000.0 and first["dur"] == 1_900_000.0  # µs from the first event
    instants = {e["name"]: e for e in trace["traceEvents"] if e["ph"] == "i"}
    assert instants["preempt bg"]["s"] == "t" and instants["runner_lost"]["s"] == "p"


def test_waits_that_overlap_in_one_tier_get_lanes_so_slices_nest() -> None:
    trace = chrome_trace([seg("a", "wait", 4, 0.0, 5.0, "dispatched"),
                          seg("b", "wait", 4, 1.0, 2.0, "dispatched"),
                          seg("c", "wait", 4, 2.0, 3.0, "cancelled")], [])
    lane = {e["args"]["job_id"]: threads(trace)[e["tid"]]
            for e in trace["traceEvents"] if e.get("cat") == "wait"}
    assert lane == {"a": "T4 waiting", "b": "T4 waiting #2", "c": "T4 waiting #2"}
    assert trace_problems(json.loads(json.dumps(trace))) == []


def test_the_validator_rejects_what_a_viewer_could_not_read() -> None:
    assert trace_problems([]) == ["not an object with a traceEvents list"]
    bad = {"traceEvents": [{"name": "x", "ph": "X", "ts": 0, "pid": 1},
                           {"name": "y", "ph": "X", "ts": 0, "pid": 1, "tid": 1},
                           {"name": "z", "ph": "i", "ts": "0", "pid": 1, "tid": 1, "s": "q"}]}
    problems = trace_problems(bad)
    assert problems[0] == "traceEvents[0]: missing tid"
    assert "dur >= 0" in problems[1]
    assert any("ts must be a number" in p for p in problems)
    assert any("instant scope" in p for p in problems)


def test_simulate_writes_the_same_layout(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    done = subprocess.run([sys.executable, "-m", "uniun.runtime", "simulate",
                           str(REPO / "examples" / "traces" / "busy_phone.jsonl"),
                           "--trace-out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    trace = json.loads(out.read_text())
    assert trace_problems(trace) == []
    assert trace["otherData"]["source"] == "uniun simulator"
    ran = run_segments(trace)
    assert ran and all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(ran, ran[1:]))
    reasons = {e["args"]["end"] for e in ran}
    assert "done" in reasons and reasons & {"preempted", "slice", "budget"}
    assert any(e["ph"] == "i" and e["cat"] == "preempt" for e in trace["traceEvents"])
    assert "T4 waiting" in threads(trace).values()


def test_since_takes_seconds_or_a_unit() -> None:
    assert [parse_since(s) for s in ("90", "90s", "5m", "2h", "1d", "1.5m")] == [
        90, 90, 300, 7200, 86400, 90]
    for bad in ("", "5 minutes", "-3", "m"):
        try:
            parse_since(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")


def test_trace_export_without_a_journal_or_with_a_bad_since_says_so(tmp_path: Path) -> None:
    env = {"UNIUN_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "uniun.runtime", "trace", "export", "--out",
           str(tmp_path / "t.json")]
    missing = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert missing.returncode == 1 and "no journal at" in missing.stderr
    bad = subprocess.run(cmd + ["--since", "soon"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert bad.returncode == 2 and "not a duration" in bad.stderr
    assert not (tmp_path / "t.json").exists()


def test_the_shipped_bench_timeline_is_a_valid_trace_of_two_preemptions() -> None:
    """examples/timelines/bench-uniun.json: `trace export` of a `bench --policies uniun`
    run (docs/observability.md says how it was made)."""
    trace = json.loads((REPO / "examples" / "timelines" / "bench-uniun.json").read_text())
    assert trace_problems(trace) == []
    ends = [e["args"]["end"] for e in run_segments(trace) if e["args"]["kind"] == "nataraj"]
    assert ends == ["preempted", "done", "preempted", "done"]
