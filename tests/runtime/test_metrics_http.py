"""The metrics exposition: values written by another process (multiprocess mode) and the
supervisor's restart counts, served over HTTP and read back with a real client."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from uniun.runtime.metrics_http import (
    ENDPOINT_FILE,
    MULTIPROC_ENV,
    MetricsServer,
    render_metrics,
    start_metrics,
)

WRITER = """
from uniun.actors.metrics import MetricSink
from uniun.actors.observe import Count, Level, Sample
MetricSink().apply([Count("preemptions", (("reason", "slice"),), 2),
                    Sample("chat_ttft_seconds", 0.2),
                    Level("queue_depth", 7, (("tier", "T4"),))])
"""


def samples(body: bytes) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def test_a_child_processes_values_and_the_restart_counts_are_scraped(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "supervisor.json").write_text(json.dumps(
        {"restarts": {"runner": 2, "scheduler": 0}, "up": {"runner": True, "scheduler": False}}))
    env, server = start_metrics(run, enabled=True, host="127.0.0.1", port=0)
    assert server is not None
    try:
        assert (run / "metrics").is_dir() and env[MULTIPROC_ENV] == str(run / "metrics")
        child = subprocess.run([sys.executable, "-c", WRITER], timeout=120,
                               env=dict(os.environ, **{MULTIPROC_ENV: env[MULTIPROC_ENV]}))
        assert child.returncode == 0
        url = (run / ENDPOINT_FILE).read_text().strip()
        assert url == server.url and url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url, timeout=30) as reply:
            got = samples(reply.read())
        assert got[("uniun_preemptions_total", (("reason", "slice"),))] == 2
        assert got[("uniun_chat_ttft_seconds_count", ())] == 1
        assert got[("uniun_queue_depth", (("tier", "T4"),))] == 7
        assert got[("uniun_process_restarts_total", (("name", "runner"),))] == 2
        assert got[("uniun_process_up", (("name", "scheduler"),))] == 0
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url.replace("/metrics", "/other"), timeout=30)
        assert err.value.code == 404
    finally:
        server.stop()
    assert not (run / ENDPOINT_FILE).exists()


def test_a_new_start_wipes_the_last_runs_values(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    (run / "metrics" / "counter_123.db").write_bytes(b"stale")
    _env, server = start_metrics(run, enabled=True, host="127.0.0.1", port=0)
    assert server is not None
    server.stop()
    assert list((run / "metrics").iterdir()) == []
    body, ctype = render_metrics(run)
    assert ctype.startswith("text/plain") and b"uniun_preemptions" not in body


def test_a_busy_port_leaves_the_runtime_running_without_an_endpoint(tmp_path: Path) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        env, server = start_metrics(tmp_path, enabled=True, host="127.0.0.1",
                                    port=busy.getsockname()[1])
        assert server is None and env[MULTIPROC_ENV]  # children still count
        assert not (tmp_path / ENDPOINT_FILE).exists()
    finally:
        busy.close()


def test_metrics_off_removes_an_inherited_multiprocess_folder(tmp_path: Path) -> None:
    env, server = start_metrics(tmp_path, enabled=False, host="127.0.0.1", port=0)
    assert env == {MULTIPROC_ENV: None} and server is None
    assert not (tmp_path / "metrics").exists()


def test_the_server_answers_on_a_free_port_by_default(tmp_path: Path) -> None:
    server = MetricsServer(tmp_path, "127.0.0.1", 0).start()
    try:
        with urllib.request.urlopen(server.url, timeout=30) as reply:
            assert reply.status == 200
    finally:
        server.stop()
