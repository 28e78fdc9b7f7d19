"""The gateway's ASGI application: the door, the API-key check, routes, OpenAI-shaped errors.

Layers, outermost first: :class:`~uniun.actors.gateway.door.Door` (Host, Origin,
Content-Type, declared length), :class:`BearerAuth`,
:class:`~uniun.actors.gateway.door.BodyLimit` (the body read within its limit and
timeout: only for a client with the key), then Starlette's routing. Every answer that is
not a success is an OpenAI error object,
a bug of ours included (500 ``internal``, its text in the log only).

Why Starlette on uvicorn (docs/http.md): both are small, maintained and the usual base of
OpenAI-compatible servers (vLLM's and llama-cpp-python's run on them); a
``StreamingResponse`` is all SSE needs, and it listens for ``http.disconnect`` while it
streams, so a client that goes away cancels its job at once.

**Mounting more routes** (e.g. ``/metrics``): pass them to :func:`build_app` as
``extra_routes`` (Starlette ``Route`` objects; ``runtime/http_main.py`` collects them in
``extra_routes()``). Handlers reach the gateway as ``request.app.state.gateway``. Every
path needs the API key when one is configured, except those in ``open_paths`` (by default
``/health``); add a path there if a scraper must reach it without the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import AsyncIterator, Collection, Sequence

from loguru import logger
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from uniun.actors.gateway import routes
from uniun.actors.gateway.door import BodyLimit, Door, DoorPolicy
from uniun.actors.gateway.errors import ApiError
from uniun.actors.gateway.gateway import Gateway

__all__ = ["OPEN_PATHS", "TICK_S", "build_app"]

OPEN_PATHS = frozenset({"/health"})  # served without the API key
TICK_S = 0.5  # the event loop marks itself alive this often (the process's health check)


class BearerAuth:
    """``Authorization: Bearer KEY`` on every path but ``open_paths`` (when a key is set)."""

    def __init__(self, app: ASGIApp, key: str, open_paths: Collection[str]) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()
        self.key = key
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.key and scope["path"] not in self.open_paths:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = ApiError(401, "a valid API key is required (Authorization: Bearer "
                                 "KEY; config [http] api_key)", code="invalid_api_key")
                await JSONResponse(error.body(), 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _api_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    error = ApiError(exc.status_code, str(exc.detail), code=code)
    return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)


async def _bug(request: Request, exc: Exception) -> Response:
    """A bug of ours: logged whole, answered as an OpenAI error without its text."""
    logger.opt(exception=exc).error("gateway bug on {} {}", request.method, request.url.path)
    error = ApiError(500, "an internal error of the gateway; see the runtime's log",
                     "server_error", code="internal")
    return JSONResponse(error.body(), status_code=500)


def build_app(gateway: Gateway, *, extra_routes: Sequence[BaseRoute] = (),
              open_paths: Collection[str] = OPEN_PATHS) -> ASGIApp:
    """The whole HTTP API over ``gateway``; ``extra_routes`` are mounted beside it."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async def tick() -> None:
            loop = asyncio.get_running_loop()
            while True:
                gateway.last_tick = loop.time()
                await asyncio.sleep(TICK_S)

        task = asyncio.ensure_future(tick())
        try:
            yield
        finally:
            task.cancel()

    app = Starlette(routes=[
        Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
        Route("/v1/completions", routes.completions, methods=["POST"]),
        Route("/v1/embeddings", routes.embeddings, methods=["POST"]),
        Route("/v1/models", routes.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", routes.get_model, methods=["GET"]),
        Route("/health", routes.health, methods=["GET"]),
        *extra_routes,
    ], exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _bug},
        lifespan=lifespan)
    app.state.gateway = gateway
    settings = gateway.settings
    policy = DoorPolicy.make(settings.bind_host, settings.allowed_hosts,
                             max_body_bytes=settings.max_body_bytes,
                             read_timeout_s=settings.read_timeout_s)
    return Door(BearerAuth(BodyLimit(app, policy), settings.api_key, open_paths), policy)
