"""The Prometheus exposition of the runtime: one function that renders, one small server.

:func:`render_metrics` is the whole exposition: it merges the ``uniun_*`` values every
process wrote under ``$UNIUN_HOME/run/metrics`` (prometheus-client's multiprocess mode,
see ``actors/metrics.py``) with the supervisor's restart counts and returns the text
format. Anything that can answer HTTP can serve it; until the HTTP gateway does, the
supervisor runs :class:`MetricsServer` on ``[metrics] host:port`` (loopback, a free port
by default) and writes its URL to ``$UNIUN_HOME/run/metrics.endpoint``.

When the runtime runs its HTTP gateway (``[http] enabled``), the gateway serves
``GET /metrics`` instead (:func:`metrics_route`, mounted by ``runtime/http_main.py``, behind
the same API key as the rest of it) and writes ``<gateway URL>/metrics`` to the endpoint
file; the supervisor then starts no server of its own.

The metrics folder is wiped at every start (:func:`prepare_metrics_dir`), so figures
count from the start of this runtime, across restarts of its processes.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from loguru import logger
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from uniun.runtime.state import read_state, write_private

__all__ = ["render_metrics", "MetricsServer", "prepare_metrics_dir", "METRICS_DIR",
           "ENDPOINT_FILE", "MULTIPROC_ENV"]

METRICS_DIR = "metrics"  # under the run dir
ENDPOINT_FILE = "metrics.endpoint"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare_metrics_dir(run_dir: Path) -> Path:
    """An empty metrics folder for a starting runtime (the last run's files removed)."""
    path = run_dir / METRICS_DIR
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


class _Supervised:
    """``uniun_process_restarts_total`` and ``uniun_process_up`` from supervisor.json."""

    def __init__(self, run_dir: Path) -> None:
        self._run_dir = run_dir

    def collect(self) -> Iterator[Any]:
        state = read_state(self._run_dir) or {}
        restarts = CounterMetricFamily("uniun_process_restarts",
                                       "Restarts of a runtime process by the supervisor.",
                                       labels=["name"])
        up = GaugeMetricFamily("uniun_process_up", "1 while the process is up "
                               "(heartbeating), else 0.", labels=["name"])
        for name, count in sorted((state.get("restarts") or {}).items()):
            if isinstance(count, int):
                restarts.add_metric([name], count)
        for name, is_up in sorted((state.get("up") or {}).items()):
            up.add_metric([name], 1.0 if is_up else 0.0)
        yield restarts
        yield up


def render_metrics(run_dir: Path) -> tuple[bytes, str]:
    """(body, content type) of a scrape of the runtime whose run dir is ``run_dir``."""
    registry = CollectorRegistry()
    metrics_dir = run_dir / METRICS_DIR
    if metrics_dir.is_dir():
        MultiProcessCollector(registry, path=str(metrics_dir))
    registry.register(_Supervised(run_dir))
    return generate_latest(registry), CONTENT_TYPE_LATEST


class MetricsServer:
    """``GET /metrics`` on ``host:port`` in a daemon thread (``port`` 0: a free one)."""

    def __init__(self, run_dir: Path, host: str, port: int) -> None:
        self.run_dir = run_dir
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path.split("?")[0] not in ("/metrics", "/metrics/"):
                    self.send_error(404, "only /metrics is served here")
                    return
                try:
                    body, ctype = render_metrics(outer.run_dir)
                except Exception as err:  # a scrape must never take the supervisor down
                    logger.exception("metrics scrape failed")
                    self.send_error(500, f"metrics: {err}")
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # scrapes are not log lines
                pass

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        bound_host, bound_port = self._httpd.server_address[:2]
        shown = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
        self.url = f"http://{shown}:{bound_port}/metrics"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics",
                                        daemon=True)

    def start(self) -> "MetricsServer":
        self._thread.start()
        write_private(self.run_dir / ENDPOINT_FILE, self.url + "\n")
        logger.info("metrics at {}", self.url)
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        try:
            (self.run_dir / ENDPOINT_FILE).unlink()
        except FileNotFoundError:
            pass


def start_metrics(run_dir: Path, *, enabled: bool, host: str, port: int,
                  serve: bool = True) -> tuple[dict[str, str | None], MetricsServer | None]:
    """The supervisor's part at start: (environment for children, the server or None).

    Enabled: a fresh metrics folder that every child writes to, and, with ``serve``
    (no HTTP gateway among the children: it serves ``/metrics`` itself), the server. A
    port that cannot be bound is logged and the runtime runs on without the endpoint
    (its processes still count; fix the port and restart). Disabled: children get no
    multiprocess folder (None removes an inherited one).
    """
    if not enabled:
        return {MULTIPROC_ENV: None}, None
    env: dict[str, str | None] = {MULTIPROC_ENV: str(prepare_metrics_dir(run_dir))}
    if not serve:
        return env, None
    try:
        return env, MetricsServer(run_dir, host, port).start()
    except OSError as err:
        logger.error("metrics endpoint {}:{} not served: {}", host, port, err)
        return env, None


def metrics_route(run_dir: Path) -> Any:
    """``GET /metrics`` for the HTTP gateway (a Starlette route; starlette is imported
    here only, so processes without the gateway never load it)."""
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def metrics(_request: Request) -> Response:
        body, ctype = await run_in_threadpool(render_metrics, run_dir)  # file reads
        return Response(body, media_type=ctype)

    return Route("/metrics", metrics, methods=["GET"])
