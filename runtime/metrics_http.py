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
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from loguru import logger
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from uniun.actors.gateway.door import DoorPolicy, check_request, error_bytes
from uniun.actors.gateway.errors import ApiError
from uniun.runtime.state import read_state, write_private

__all__ = [
    "ENDPOINT_FILE",
    "METRICS_DIR",
    "MULTIPROC_ENV",
    "MetricsServer",
    "prepare_metrics_dir",
    "render_metrics",
]

METRICS_DIR = "metrics"  # under the run dir
ENDPOINT_FILE = "metrics.endpoint"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
READ_TIMEOUT_S = 10.0  # a scraper must send its request within this, seconds


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
    """``GET /metrics`` on ``host:port`` in a daemon thread (``port`` 0: a free one).

    Behind the same door as the gateway (``actors/gateway/door.py``): a ``Host`` that
    is not a loopback name, ``host`` itself or one of ``allowed_hosts`` gets 421, a
    request from a web page of another origin 403, any body 413 (a scrape has none),
    any method but GET and HEAD 405; every refusal is an OpenAI-style JSON error.
    A client that does not send its request within :data:`READ_TIMEOUT_S` is dropped,
    so idle connections cannot pile up threads.
    """

    def __init__(self, run_dir: Path, host: str, port: int,
                 allowed_hosts: Iterable[str] = ()) -> None:
        self.run_dir = run_dir
        outer = self
        policy = DoorPolicy.make(host, allowed_hosts, max_body_bytes=0,
                                 read_timeout_s=READ_TIMEOUT_S)

        class Handler(BaseHTTPRequestHandler):
            timeout = READ_TIMEOUT_S  # socket timeout while reading a request

            def _refuse(self, error: ApiError) -> None:
                body = error_bytes(error)
                if self.request_version == "HTTP/0.9":  # answer with a status line anyway
                    self.request_version = "HTTP/1.0"
                self.send_response(error.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                self.close_connection = True

            def _door(self) -> bool:
                headers = [(k.lower().encode("latin-1"), v.encode("latin-1", "replace"))
                           for k, v in self.headers.items()]
                refusal = check_request(self.command, headers, policy)
                if refusal is not None:
                    self._refuse(refusal)
                    return False
                return True

            def do_GET(self) -> None:
                if not self._door():
                    return
                if self.path.split("?")[0] not in ("/metrics", "/metrics/"):
                    self._refuse(ApiError(404, "only /metrics is served here",
                                          code="not_found"))
                    return
                try:
                    body, ctype = render_metrics(outer.run_dir)
                except Exception:  # noqa: BLE001 - a scrape must never take the supervisor down
                    logger.exception("metrics scrape failed")
                    self._refuse(ApiError(500, "the metrics could not be read; see the log",
                                          "server_error", code="internal"))
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_HEAD = do_GET

            def _not_allowed(self) -> None:
                if self._door():
                    self._refuse(ApiError(405, "only GET /metrics is served here",
                                          code="method_not_allowed"))

            do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _not_allowed

            def send_error(self, code: int, message: str | None = None,
                           explain: str | None = None) -> None:
                """http.server's own refusals (a malformed request line, an unknown
                method: 501) as JSON 4xx errors, without the server's text."""
                status = 405 if code == 501 else code if 400 <= code < 500 else 400
                self._refuse(ApiError(status, "malformed or unsupported request",
                                      code="bad_envelope"))

            def log_message(self, *args: Any) -> None:  # scrapes are not log lines
                pass

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        bound_host, bound_port = self._httpd.server_address[:2]
        shown = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
        self.url = f"http://{shown}:{bound_port}/metrics"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics",
                                        daemon=True)

    def start(self) -> MetricsServer:
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
                  serve: bool = True, allowed_hosts: Iterable[str] = ()
                  ) -> tuple[dict[str, str | None], MetricsServer | None]:
    """The supervisor's part at start: (environment for children, the server or None).

    Enabled: a fresh metrics folder that every child writes to, and, with ``serve``
    (no HTTP gateway among the children: it serves ``/metrics`` itself), the server,
    answering to the loopback names, ``host`` and ``allowed_hosts`` (``[http]
    allowed_hosts``: one list of names for both listeners). A
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
        return env, MetricsServer(run_dir, host, port, allowed_hosts).start()
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
