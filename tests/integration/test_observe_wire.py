"""Observability end to end: a real runtime (tiny model) scraped over HTTP, its timeline
exported with the CLI, ``top --once``, ``submit --json`` / ``attach`` and JSON logs.

The metrics are read the way Prometheus reads them: an HTTP GET of the URL the runtime
wrote to ``run/metrics.endpoint``, parsed with prometheus-client's own text parser. Every
wait is generous; assertions are on what the runtime decided and counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.wait import wait_for
from uniun.protocol.client import ClientError
from uniun.runtime.timeline import run_segments, trace_problems

from .harness import BASE_CONFIG, Runtime, chat_job, long_job, wait_tokens

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(rt: Runtime) -> Samples:
    url = (rt.home / "run" / "metrics.endpoint").read_text().strip()
    with urllib.request.urlopen(url, timeout=30) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        body = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def value(samples: Samples, metric: str, **labels: str) -> float:
    return samples.get((metric, tuple(sorted(labels.items()))), 0.0)


def cli(rt: Runtime, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "uniun.runtime", *args], env=rt.env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_preemption_moves_the_metrics_and_shows_in_the_trace_and_top(
        make_runtime: Callable[..., Runtime]) -> None:
    rt = make_runtime()
    before = scrape(rt)
    assert value(before, "uniun_process_up", name="scheduler") == 1
    w = rt.wire()
    w.submit(long_job("ob-bg", "nataraj"))
    wait_tokens(w, "ob-bg", 20)
    w.submit(chat_job("ob-chat"))
    chat = w.end("ob-chat")
    bg = w.end("ob-bg")
    assert chat["type"] == bg["type"] == "done" and bg["preemptions"] == 1

    def moved() -> Samples | None:
        now = scrape(rt)
        return now if value(now, "uniun_jobs_done_total", kind="nataraj", tier="T4") == 1 \
            else None

    after = wait_for("the scrape to count the finished jobs", moved)
    for kind, tier in (("chat", "T0"), ("nataraj", "T4")):
        assert value(after, "uniun_jobs_accepted_total", kind=kind, tier=tier) == 1
        assert value(after, "uniun_jobs_done_total", kind=kind, tier=tier) == 1
    assert value(after, "uniun_preemptions_total", reason="preempted") == 1
    assert value(after, "uniun_tokens_generated_total", kind="chat") == \
        chat["usage"]["completion_tokens"]
    assert value(after, "uniun_tokens_generated_total", kind="nataraj") == \
        bg["usage"]["completion_tokens"]
    assert value(after, "uniun_chat_ttft_seconds_count") == 1
    assert value(after, "uniun_pause_seconds_count", kind="nataraj", reason="preempted") == 1
    assert value(after, "uniun_queue_wait_seconds_count", kind="chat") == 1
    steps = sum(value(after, "uniun_runner_step_seconds_count", phase=p)
                for p in ("first", "decode"))
    assert steps == chat["usage"]["completion_tokens"] + bg["usage"]["completion_tokens"]
    assert ("uniun_queue_depth", (("tier", "T4"),)) in after
    assert value(after, "uniun_process_restarts_total", name="runner") == 0

    out = rt.home / "trace.json"
    export = cli(rt, "trace", "export", "--out", str(out))
    assert export.returncode == 0, export.stderr
    trace = json.loads(out.read_text())
    assert trace_problems(trace) == []
    ran = [(e["args"]["job_id"], e["args"]["end"]) for e in run_segments(trace)
           if e["args"]["job_id"] in ("ob-bg", "ob-chat")]
    assert ran == [("ob-bg", "preempted"), ("ob-chat", "done"), ("ob-bg", "done")]
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "i"}
    assert {"preempt ob-bg", "resume ob-bg", "runner_up", "scheduler_start"} <= names
    recent = cli(rt, "trace", "export", "--since", "1h", "--out", "-")
    assert recent.returncode == 0 and json.loads(recent.stdout)["otherData"]["segments"] >= 6

    top = cli(rt, "top", "--once", "--width", "100")
    assert top.returncode == 0, top.stderr
    assert "UNIUN top" in top.stdout and "model tiny-1" in top.stdout
    assert "preempted for ob-chat" in top.stdout and "scheduler" in top.stdout
    watch = subprocess.Popen([sys.executable, "-m", "uniun.runtime", "status", "--watch",
                              "--interval", "0.5"], env=rt.env, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert watch.stdout is not None
        lines = [watch.stdout.readline() for _ in range(4)]
        assert lines[0].startswith("UNIUN top") and "policy uniun" in "".join(lines)
    finally:
        watch.terminate()
        watch.wait(timeout=30)


def test_submit_json_prints_json_lines_and_attach_follows_a_no_wait_job(
        runtime: Runtime) -> None:
    done = cli(runtime, "submit", "hello", "--kind", "nataraj", "--max-new-tokens", "5",
               "--json", "--job-id", "ob-json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines[0]["type"] == "accepted" and lines[-1]["type"] == "done"
    assert [e["seq"] for e in lines if e["type"] == "token"] == list(range(5))
    queued = cli(runtime, "submit", "hello", "--kind", "nataraj", "--max-new-tokens", "8",
                 "--no-wait", "--job-id", "ob-later")
    assert queued.returncode == 0 and queued.stdout.strip() == "ob-later"
    attached = cli(runtime, "attach", "ob-later", "--json")
    assert attached.returncode == 0, attached.stderr
    events = [json.loads(line) for line in attached.stdout.splitlines()]
    assert events[0]["type"] == "accepted" and events[-1]["type"] == "done"
    assert events[-1]["usage"]["completion_tokens"] == 8
    text = cli(runtime, "attach", "ob-later")  # ended: its outcome at once, as text
    assert text.returncode == 0 and text.stdout.strip() == events[-1]["text"].strip()
    missing = cli(runtime, "attach", "no-such-job")
    assert missing.returncode == 1 and "not_found" in missing.stderr


def test_logging_json_writes_json_lines_with_the_job_id(
        make_runtime: Callable[..., Runtime]) -> None:
    rt = make_runtime(BASE_CONFIG + "\n[logging]\njson = true\n[metrics]\nenabled = false\n")
    w = rt.wire()
    w.submit({"job_id": "ob-log", "kind": "nataraj", "prompt": "hi", "max_new_tokens": 3})
    assert w.end("ob-log")["type"] == "done"
    assert not (rt.home / "run" / "metrics.endpoint").exists()  # metrics off: no endpoint

    def logged() -> list[dict[str, Any]] | None:
        records = [json.loads(line)["record"] for name in ("scheduler", "runner")
                   for line in (rt.home / "logs" / f"{name}.log").read_text().splitlines()]
        about = [r for r in records if r["extra"].get("job") == "ob-log"]
        return records if any("ended" in r["message"] for r in about) else None

    # every line of both processes is one JSON object (json.loads above raises if not)
    records = wait_for("the scheduler's JSON line about the job's end", logged)
    assert {r["extra"]["proc"] for r in records} == {"scheduler", "runner"}
    assert all(set(r["extra"]) >= {"proc", "job"} for r in records)
    assert any(r["extra"]["job"] is None for r in records)  # lines about no job: null


def test_the_embedding_pool_counts_its_requests_and_their_latency(minilm_dir: Any,
                                                                    tmp_path: Any) -> None:
    """The pool process, started the way the supervisor starts it, with the metrics
    folder the supervisor would give it; read back by the exposition."""
    import signal
    import tempfile
    from pathlib import Path

    from tests.embedding_fixtures import Pool
    from uniun.runtime.metrics_http import MULTIPROC_ENV, prepare_metrics_dir, render_metrics

    run = tmp_path / "run"
    metrics_dir = prepare_metrics_dir(run)
    with tempfile.TemporaryDirectory(prefix="uo-") as tmp:  # ipc paths must be short
        endpoint = f"ipc://{tmp}/embed.sock"
        config = Path(tmp) / "uniun.toml"
        config.write_text(f'[embed]\nenabled = true\nworkers = 1\nendpoint = "{endpoint}"\n')
        proc = subprocess.Popen([sys.executable, "-m", "uniun.runtime.process", "embed",
                                 "--config", str(config)], stdin=subprocess.DEVNULL,
                                env={**os.environ, MULTIPROC_ENV: str(metrics_dir)})
        pool = Pool(endpoint, proc, 64)
        try:
            pool.wait_ready()
            with pool.client() as client:
                client.embed(["one text"])
                client.embed(["two", "texts"])
                with pytest.raises(ClientError):
                    client.embed([])  # refused before admission: not an answered request
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    body, _ = render_metrics(run)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}
    assert got[("uniun_embed_requests_total", (("outcome", "ok"),))] == 2
    assert got[("uniun_embed_latency_seconds_count", ())] == 2
