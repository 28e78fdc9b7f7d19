"""The trace simulator and its command: trace checking, the summary, uniun against fcfs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO as ROOT
from uniun.actors.sim.simulator import CostModel, Simulation, simulate, summarize
from uniun.actors.sim.trace import Cancel, Foreground, Lifecycle, Submit, TraceError, parse_trace
from uniun.runtime.cli import main

TRACES = sorted((ROOT / "examples" / "traces").glob("*.jsonl"))
MODEL = "m"


def line(t: float, event: str, **body: object) -> str:
    return json.dumps({"t": t, "event": event, **body})


def job(job_id: str, kind: str = "gana", **extra: object) -> dict:
    body = {"job_id": job_id, "kind": kind, "prompt": "p", "prompt_tokens": 100,
            "new_tokens": 50, **extra}
    body.setdefault("max_new_tokens", body["new_tokens"])
    return body


def test_trace_parses_every_event_kind() -> None:
    events = parse_trace([
        line(0, "submit", job=job("a", deadline=30.0)),
        "",
        line(1.5, "foreground", kind="nataraj"),
        line(2, "foreground", kind=None),
        line(3, "lifecycle", state="background"),
        line(4, "cancel", job_id="a"),
    ], default_model=MODEL)
    assert [type(e) for e in events] == [Submit, Foreground, Foreground, Lifecycle, Cancel]
    submit = events[0]
    assert isinstance(submit, Submit) and submit.spec.model_id == MODEL
    assert submit.prompt_tokens == 100 and submit.new_tokens == 50 and submit.line == 1
    assert submit.spec.deadline == 30.0


@pytest.mark.parametrize("bad, where, words", [
    ("{not json", 2, "not JSON"),
    ("[1, 2]", 2, "must be a JSON object"),
    (line(-1, "submit", job=job("x")), 2, "t:"),
    (line(5, "explode"), 2, "event:"),
    (line(5, "submit", job=job("x", kind="poetry")), 2, "job.kind"),
    (line(5, "submit", job=job("x", new_tokens=0)), 2, "job.new_tokens"),
    (line(5, "submit", job={"job_id": "x", "kind": "gana", "prompt_tokens": 1,
                            "new_tokens": 1}), 2, "messages or prompt"),
    (line(5, "submit", job=job("a")), 2, "submitted twice"),
    (line(5, "cancel", job_id="nobody"), 2, "not submitted"),
    (line(5, "foreground", kind="poetry"), 2, "kind:"),
    (line(5, "lifecycle", state="asleep"), 2, "state:"),
    (line(5, "lifecycle", state="background", extra=1), 2, "extra"),
    (line(0.5, "foreground", kind=None), 2, "time-ordered"),
])
def test_bad_trace_line_is_reported_with_its_line_number(bad: str, where: int,
                                                         words: str) -> None:
    with pytest.raises(TraceError) as err:
        parse_trace([line(1, "submit", job=job("a")), bad], default_model=MODEL)
    assert err.value.line == where
    assert str(err.value).startswith(f"line {where}: ") and words in str(err.value)


def test_simulate_command_rejects_a_bad_trace_with_exit_2_and_simulates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(line(0, "submit", job=job("a")) + "\n" + line(1, "cancle", job_id="a")
                     + "\n")
    assert main(["simulate", str(trace), "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "line 2: event:" in err
    assert main(["simulate", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["simulate", str(trace), "--decode-ms-per-token", "0"]) == 2


def busy_trace() -> list:
    events: list = [line(0.0, "submit", job=job(f"n{i}", "nataraj", new_tokens=500))
                    for i in range(10)]
    events += [line(1.0 + 10 * i, "submit", job=job(f"c{i}", "chat", new_tokens=40))
               for i in range(5)]
    return parse_trace(events, default_model=MODEL)


def test_simulation_summary_has_the_documented_shape_and_loses_nothing() -> None:
    summary = simulate("uniun", busy_trace(), CostModel(), default_model=MODEL)
    assert set(summary) == {"policy", "kinds", "flows", "swaps", "preemptions", "lost"}
    assert set(summary["kinds"]["chat"]) == {"count", "wait_p50_s", "wait_p99_s",
                                             "ttft_p50_s", "ttft_p99_s", "completion_p50_s"}
    assert summary["kinds"]["chat"]["count"] == 5 and summary["lost"] == 0
    assert set(summary["flows"]) == {"chat", "nataraj"}
    assert sum(f["share"] for f in summary["flows"].values()) == pytest.approx(1, abs=1e-3)


def test_uniun_serves_chat_far_faster_than_fcfs_and_both_finish_everything() -> None:
    cost = CostModel()
    uniun = simulate("uniun", busy_trace(), cost, default_model=MODEL)
    fcfs = simulate("fcfs", busy_trace(), cost, default_model=MODEL)
    assert uniun["lost"] == fcfs["lost"] == 0
    # The chat waits at most one token (or one prefill chunk) under uniun ...
    assert uniun["kinds"]["chat"]["wait_p99_s"] <= 64 * cost.prefill_ms_per_token / 1000
    # ... and behind whole background generations under fcfs.
    assert fcfs["kinds"]["chat"]["ttft_p50_s"] >= 10 * uniun["kinds"]["chat"]["ttft_p50_s"]
    assert uniun["preemptions"] >= 1 and fcfs["preemptions"] == 0
    # Preempted work resumes, not restarts: the same runner time in total.
    assert (sum(f["runner_s"] for f in uniun["flows"].values())
            == pytest.approx(sum(f["runner_s"] for f in fcfs["flows"].values()), rel=0.02))


def test_cancel_and_background_lifecycle_in_a_trace() -> None:
    events = parse_trace([
        line(0, "submit", job=job("long", "nataraj", new_tokens=400)),
        line(0.1, "submit", job=job("queued", "nataraj")),
        line(1.0, "cancel", job_id="queued"),
        line(1.0, "lifecycle", state="background"),
        line(60.0, "lifecycle", state="foreground"),
    ], default_model=MODEL)
    sim = Simulation("uniun", events, CostModel(), default_model=MODEL)
    result = sim.run()
    assert result.jobs["queued"].outcome == "cancelled"
    long = result.jobs["long"]
    assert long.outcome == "done" and long.tokens == 400
    # Paused when the app left (full-budget dispatch), re-run under a 100-token grant,
    # held when the grant ran out, resumed in the foreground: every token, in the end.
    assert long.pauses == 2 and long.end is not None and long.end > 60.0
    assert summarize(result)["lost"] == 0


@pytest.mark.parametrize("trace", TRACES, ids=[t.name for t in TRACES])
def test_shipped_traces_lose_nothing_under_either_policy(trace: Path) -> None:
    out = {}
    for policy in ("uniun", "fcfs"):
        proc = subprocess.run(
            [sys.executable, "-m", "uniun.runtime", "simulate", str(trace), "--json",
             "--policy", policy], capture_output=True, text=True, check=True, timeout=300)
        out[policy] = json.loads(proc.stdout)
        assert out[policy]["policy"] == policy and out[policy]["lost"] == 0
    chat = {p: out[p]["kinds"]["chat"] for p in out}
    assert chat["fcfs"]["ttft_p50_s"] >= 2 * chat["uniun"]["ttft_p50_s"]


def test_table_output_is_readable(capsys: pytest.CaptureFixture[str]) -> None:
    assert TRACES, "the example traces are missing"
    assert main(["simulate", str(TRACES[0]), "--policy", "fcfs"]) == 0
    out = capsys.readouterr().out
    assert "policy: fcfs" in out and "wait p50" in out and "lost: 0" in out
