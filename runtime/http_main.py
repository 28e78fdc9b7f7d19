"""Entry point of the HTTP gateway process (``http`` in the process registry).

``python -m uniun.runtime.process http --config FILE`` (the supervisor spawns it when
``[http] enabled``) ends up in :func:`main`: it binds ``[http] host``:``port`` (port 0 =
any free port), writes the base URL to ``$UNIUN_HOME/run/http.endpoint`` once it serves,
and runs uvicorn until the supervisor's SIGTERM. uvicorn runs with the gateway's own h11
protocol (``actors/gateway/serving.py``: a header-read timeout, a connection cap answered
429, JSON refusals of malformed requests) under the door of ``actors/gateway/door.py``.
On SIGTERM new requests get 503 ``shutting_down`` and uvicorn drains the open ones for
``DRAIN_S``; a stream still open then is closed, which cancels its job.

**Extra routes**: :func:`extra_routes` mounts ``GET /metrics`` (the Prometheus exposition
of ``runtime/metrics_http.py``) beside the OpenAI API, behind the same API-key check;
the gateway writes its URL to ``run/metrics.endpoint``, and the supervisor then serves
no metrics port of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from loguru import logger
from starlette.routing import BaseRoute

from uniun.actors.gateway.app import OPEN_PATHS, build_app
from uniun.actors.gateway.console_routes import Console, ConsoleSettings
from uniun.actors.gateway.gateway import Gateway, GatewaySettings
from uniun.actors.gateway.serving import protocol_class
from uniun.actors.producers.results_reader import ResultsReader
from uniun.actors.scheduler.journal import read_timeline
from uniun.runtime import process
from uniun.runtime.config import RuntimeConfig
from uniun.runtime.metrics_http import ENDPOINT_FILE as METRICS_ENDPOINT, metrics_route
from uniun.runtime.paths import models_dir
from uniun.runtime.security import client_curve
from uniun.runtime.state import HTTP_ENDPOINT_FILE

DRAIN_S = 3.0  # seconds open requests get after SIGTERM
HUNG_AFTER_S = 10.0  # an event loop that has not ticked for this long is hung


def extra_routes(config: RuntimeConfig, console: Console | None = None) -> list[BaseRoute]:
    """Routes mounted beside the OpenAI API: ``/metrics`` (docs/observability.md) and the
    console's (docs/console.md)."""
    routes: list[BaseRoute] = [metrics_route(config.run_dir)] if config.metrics.enabled else []
    return routes + (console.routes() if console is not None else [])


def journal_timeline(path: Path) -> Callable[[float], tuple[list[Any], list[Any]]]:
    """The console's backfill: the journal's timeline since a time (read-only; none
    before the scheduler made the journal)."""
    def read(since: float) -> tuple[list[Any], list[Any]]:
        if not path.exists():
            return [], []
        segments, marks = read_timeline(path, since=since)
        return list(segments), list(marks)
    return read


def console_settings(config: RuntimeConfig) -> ConsoleSettings:
    return ConsoleSettings(
        home=config.home, kinds=tuple(config.jobs.kinds),
        chat_kind=config.policy.policy_config().chat_kind,
        max_tokens_cap=config.limits.max_new_tokens_cap,
        window_s=config.http.console_window_s, chaos=config.http.console_chaos,
        max_restarts=config.supervisor.max_restarts,
        restart_window_s=config.supervisor.restart_window_s)


def settings_from_config(config: RuntimeConfig) -> GatewaySettings:
    h = config.http
    return GatewaySettings(
        front=config.front.endpoint,
        embed=config.embed.endpoint if config.embed.enabled else None,
        embed_model=config.models.embed_model, models_root=models_dir(), api_key=h.api_key,
        default_max_tokens=min(h.default_max_tokens, config.limits.max_new_tokens_cap),
        max_open_requests=h.max_open_requests,
        max_open_requests_per_client=h.max_open_requests_per_client,
        chat_reserve=h.chat_reserve, chat_kind=config.policy.policy_config().chat_kind,
        max_body_bytes=config.limits.max_frame_bytes,
        bind_host=h.host, allowed_hosts=tuple(h.allowed_hosts),
        read_timeout_s=h.read_timeout_s, max_connections=h.max_connections,
        front_curve=client_curve(config.front.endpoint),
        embed_curve=client_curve(config.embed.endpoint) if config.embed.enabled else None)


def base_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


def bind(host: str, port: int) -> socket.socket:
    """A listening socket; port 0 asks the OS for a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as err:
        sock.close()
        raise SystemExit(f"cannot bind {base_url(host, port)}: {err.strerror}; set another "
                         "[http] port (0 = any free port) or [http] enabled = false") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def endpoint_path(config: RuntimeConfig) -> Path:
    return config.run_dir / HTTP_ENDPOINT_FILE


def main(config: RuntimeConfig) -> int:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn without its own signal handlers: runtime.process owns SIGTERM."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    gateway = Gateway(settings_from_config(config))
    console = (Console(gateway, console_settings(config), results=ResultsReader(
        config.results_path), timeline=journal_timeline(config.home / "journal.db"))
        if config.http.console else None)
    open_paths = OPEN_PATHS | (console.open_paths() if console is not None else set())
    app = build_app(gateway, extra_routes=extra_routes(config, console), open_paths=open_paths)
    sock = bind(config.http.host, config.http.port)
    url = base_url(config.http.host, sock.getsockname()[1])
    settings = gateway.settings
    server = Server(uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="on",
        timeout_graceful_shutdown=int(DRAIN_S),
        http=protocol_class(settings.read_timeout_s, settings.max_connections)))

    def stop() -> None:
        gateway.stopping = True
        server.should_exit = True
        if console is not None:  # open feeds end now instead of at the drain's end
            console.stop()

    process.on_stop(stop)
    process.set_health_check(lambda: time.monotonic() - gateway.last_tick < HUNG_AFTER_S)
    path = endpoint_path(config)
    metrics = config.run_dir / METRICS_ENDPOINT

    async def serve() -> None:
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            path.write_text(url + "\n")
            if config.metrics.enabled:  # the supervisor leaves /metrics to us
                metrics.write_text(url + "/metrics\n")
            logger.info("serving the OpenAI-compatible API at {}{}", url,
                        f" and the console at {url}/" if console is not None else "")
        await task

    try:
        asyncio.run(serve())
    finally:
        if console is not None:
            console.close()
        gateway.close()
        for written, text in ((path, url), (metrics, url + "/metrics")):
            with contextlib.suppress(OSError):
                if written.read_text().strip() == text:
                    written.unlink()
    return 0 if process.STOPPING.is_set() or server.started else 1


if __name__ == "__main__":  # pragma: no cover - the supervisor runs ``process http``
    sys.exit("run it as: python -m uniun.runtime.process http --config FILE")
