"""The console: a page served by the gateway at ``/``, its live feed and its controls.

Routes (docs/console.md, docs/http.md):

- ``GET /`` and ``GET /console/{file}``: the page's static files (plain HTML, CSS and
  JavaScript modules shipped in the package, ``actors/gateway/console/``), served without
  the API key (they hold no data) with a strict Content-Security-Policy (the page's own
  origin only) and ``frame-ancestors 'none'`` (no other site can frame its buttons);
  ``/`` also gives a browser without one the console cookie (``clients.py``), which tells
  its requests from other clients' at the same address;
- ``GET /console/api/events``: the live feed, Server-Sent Events of the hub's one
  ``watch`` (``console_hub``), bounded per client and in all;
- ``GET /console/api/results``, ``POST /console/api/search``: the results store;
- ``POST /console/api/jobs | cancel | foreground | lifecycle | chaos`` and
  ``GET /console/api/chaos``: the controls.

The chat itself is the OpenAI route (``/v1/chat/completions``), as any client sends it.
Everything under ``/console/api/`` is behind the API key when one is set, and behind the
door like the API: a page of another origin can neither read it nor post to it.
"""

from __future__ import annotations

import asyncio
import hashlib
import mimetypes
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from uniun.actors.gateway import console_control as cc
from uniun.actors.gateway.body import parse_json
from uniun.actors.gateway.clients import client_of, give_cookie
from uniun.actors.gateway.console_chaos import MIN_RESTARTS, ChaosRound
from uniun.actors.gateway.console_hub import END, RESYNC, Hub, ResultsSource, TimelineSource
from uniun.actors.gateway.errors import ApiError, bad_request, from_protocol
from uniun.actors.gateway.gateway import Gateway
from uniun.actors.policy.tiers import TIER_LABELS, TIER_NAMES
from uniun.protocol.client import Client, ClientError, SchedulerUnavailable, Timeout

__all__ = ["STATIC_DIR", "Console", "ConsoleSettings"]

STATIC_DIR = Path(__file__).with_name("console")
KEEPALIVE_S = 15.0  # an SSE comment this often keeps proxies and the page's watchdog calm
TICK_S = 1.0  # an open feed looks at the gateway's stopping flag this often, s
CONTROL_TIMEOUT_S = 10.0  # a control request's reply, s
RESULTS_MAX = 100  # results of one kind per request, at most
SEARCH_MAX = 20  # search hits, at most
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "object-src 'none'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml"}


@dataclass(frozen=True)
class ConsoleSettings:
    """What the console needs from the runtime's config (``runtime/http_main.py``)."""

    home: Path  # $UNIUN_HOME: journal.db and results.db are read there
    kinds: tuple[str, ...] = ("chat", "extract", "nataraj", "gana")  # [jobs] kinds
    chat_kind: str = "chat"
    max_tokens_cap: int = 4096  # [limits] max_new_tokens_cap
    window_s: float = 600.0  # [http] console_window_s: the timeline a page gets at load
    chaos: bool = True  # [http] console_chaos: the chaos round may be started
    max_restarts: int = 5  # [supervisor] max_restarts
    restart_window_s: float = 60.0  # [supervisor] restart_window_s


def static_files(folder: Path = STATIC_DIR) -> dict[str, tuple[bytes, str, str]]:
    """name -> (bytes, content type, ETag) of every file the page is made of."""
    files: dict[str, tuple[bytes, str, str]] = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.is_file() and not path.name.startswith("."):
            data = path.read_bytes()
            kind = TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] \
                or "application/octet-stream"
            files[path.name] = (data, kind, '"' + hashlib.sha256(data).hexdigest()[:16] + '"')
    return files


class Console:
    """The console's state in the gateway process: the hub, the results, the chaos round.

    ``results`` and ``timeline`` read the producers' results store and the scheduler's
    journal, read-only; the runtime passes them in (they belong to other rooms), a test
    may pass None (no results, no backfill)."""

    def __init__(self, gateway: Gateway, settings: ConsoleSettings, *,
                 results: ResultsSource | None = None,
                 timeline: TimelineSource | None = None) -> None:
        self.gateway = gateway
        self.settings = settings
        self.files = static_files()
        self.results = results
        self.hub = Hub(gateway.settings.front, curve=gateway.settings.front_curve,
                       journal=timeline, results=results, window_s=settings.window_s,
                       extra=self._extra)
        chaos_ok = settings.chaos and settings.max_restarts >= MIN_RESTARTS
        why = ("[http] console_chaos = false" if not settings.chaos else
               f"[supervisor] max_restarts is below {MIN_RESTARTS}" if not chaos_ok else "")
        self.chaos = ChaosRound(settings.home, publish=self.hub.publish, enabled=chaos_ok,
                                why_disabled=why, min_gap_s=settings.restart_window_s)
        self._loop: asyncio.AbstractEventLoop | None = None

    def _extra(self) -> dict[str, Any]:
        s = self.settings
        return {"console": {"kinds": list(s.kinds), "chat_kind": s.chat_kind,
                            "tiers": [{"name": name, "label": label}
                                      for name, label in zip(TIER_NAMES, TIER_LABELS)],
                            "max_tokens_cap": s.max_tokens_cap,
                            "embeddings": self.gateway.settings.embed is not None},
                "chaos": self.chaos.view()}

    def open_paths(self) -> set[str]:
        """Paths served without the API key: the static files (they hold no data)."""
        return {"/"} | {f"/console/{name}" for name in self.files}

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/", self.index, methods=["GET"]),
            Route("/console/api/events", self.events, methods=["GET"]),
            Route("/console/api/results", self.list_results, methods=["GET"]),
            Route("/console/api/search", self.search, methods=["POST"]),
            Route("/console/api/jobs", self.submit, methods=["POST"]),
            Route("/console/api/cancel", self.cancel, methods=["POST"]),
            Route("/console/api/foreground", self.foreground, methods=["POST"]),
            Route("/console/api/lifecycle", self.lifecycle, methods=["POST"]),
            Route("/console/api/chaos", self.chaos_round, methods=["GET", "POST"]),
            Route("/console/{name}", self.static, methods=["GET"]),
        ]

    def stop(self) -> None:
        """The gateway stops (any thread): open feeds end, a chaos round is stopped."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._stop_on_loop)
                return
            except RuntimeError:
                pass
        self.hub.close()

    def _stop_on_loop(self) -> None:
        self.hub.end_all()
        self.chaos.close()

    def close(self) -> None:
        self.hub.close()

    # -- the page -----------------------------------------------------------------

    def _file(self, request: Request, name: str) -> Response:
        found = self.files.get(name)
        if found is None:
            raise ApiError(404, f"no file {name!r} in the console", code="not_found")
        data, kind, etag = found
        headers = {**PAGE_HEADERS, "ETag": etag}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return Response(data, media_type=kind, headers=headers)

    async def index(self, request: Request) -> Response:
        """The page, and the console cookie that tells this browser from other clients
        at the same address (``clients.py``)."""
        return give_cookie(request, self._file(request, "index.html"))

    async def static(self, request: Request) -> Response:
        return self._file(request, request.path_params["name"])

    # -- the live feed --------------------------------------------------------------

    async def events(self, request: Request) -> Response:
        self.gateway.check_open()
        self._loop = asyncio.get_running_loop()
        try:
            sub = self.hub.subscribe(client_of(request))
        except OverflowError as err:
            raise ApiError(429, str(err), "rate_limit_error", code="queue_full") from None
        hub, gateway = self.hub, self.gateway

        async def feed() -> AsyncIterator[bytes]:
            try:
                yield hub.snapshot()
                quiet = 0.0
                while not gateway.stopping:
                    try:
                        frame = await asyncio.wait_for(sub.queue.get(), TICK_S)
                    except asyncio.TimeoutError:
                        quiet += TICK_S
                        if quiet >= KEEPALIVE_S:
                            quiet = 0.0
                            yield b": keepalive\n\n"
                        continue
                    quiet = 0.0
                    if frame is END:
                        return
                    yield hub.snapshot() if frame is RESYNC else frame
            finally:
                hub.unsubscribe(sub)

        return StreamingResponse(feed(), media_type="text/event-stream", headers=SSE_HEADERS)

    # -- results ------------------------------------------------------------------

    async def list_results(self, request: Request) -> Response:
        kind = request.query_params.get("kind", "knowledge")
        if kind not in ("knowledge", "card", "gana", "embedding"):
            raise bad_request("kind must be knowledge, card, gana or embedding", "kind")
        try:
            limit = int(request.query_params.get("limit", "30"))
        except ValueError:
            raise bad_request("limit must be an integer", "limit") from None
        if not 1 <= limit <= RESULTS_MAX:
            raise bad_request(f"limit must be from 1 to {RESULTS_MAX}", "limit")
        results = self.results
        items = await asyncio.to_thread(results.results, kind, limit) if results else []
        return JSONResponse({"kind": kind, "items": items})

    async def search(self, request: Request) -> Response:
        body = parse_json(await request.body())
        query = body.get("query") if isinstance(body, dict) else None
        if not isinstance(query, str) or not query.strip() or len(query) > 2000:
            raise bad_request("query must be a non-empty string of at most 2000 characters",
                              "query")
        k = body.get("k", 8)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= SEARCH_MAX:
            raise bad_request(f"k must be an integer from 1 to {SEARCH_MAX}", "k")
        results = self.results
        if results is None:
            return JSONResponse({"hits": [], "reason": "this runtime has no results store"})
        with self.gateway.slot(client_of(request)):  # as an embedding request holds one
            vector = (await self._embed(query))[0]
        hits, reason = await asyncio.to_thread(results.search, vector, k)
        return JSONResponse({"hits": hits, "reason": reason})

    async def _embed(self, query: str) -> Any:
        """The query's vector from the embedding pool (its refusals as HTTP errors)."""
        if self.gateway.settings.embed is None:
            raise ApiError(503, "search needs the embedding pool ([embed] enabled = true)",
                           "server_error", code="shutting_down")
        try:
            return await self.gateway.link.embed([query])
        except ClientError as err:
            raise from_protocol(err.code, err.message, err.field) from None
        except (ConnectionError, SchedulerUnavailable, Timeout) as err:
            logger.info("console: search not served: {}", err)
            raise ApiError(503, "the embedding pool is not reachable; retry", "server_error",
                           code="shutting_down") from None

    # -- controls -----------------------------------------------------------------

    async def _body(self, request: Request) -> Any:
        self.gateway.check_open()
        return parse_json(await request.body())

    async def _call(self, what: str, fn: Any) -> Any:
        try:
            return await self.gateway.link.call(fn)
        except ClientError as err:
            raise cc.refused(err) from None
        except (SchedulerUnavailable, Timeout, ConnectionError) as err:
            logger.info("console: {} not served: {}", what, err)
            raise ApiError(503, "the scheduler is not reachable; retry", "server_error",
                           code="shutting_down") from None

    async def submit(self, request: Request) -> Response:
        s = self.settings
        job = cc.background_job(await self._body(request), s.kinds, s.max_tokens_cap,
                                s.chat_kind)
        settings = self.gateway.settings

        def send() -> dict[str, Any]:
            # A client of its own, closed at once: the job is not followed here (its
            # events would pile up in a pooled client); the timeline shows it.
            with Client(settings.front, timeout=CONTROL_TIMEOUT_S,
                        curve=settings.front_curve) as client:
                return dict(client.submit(job).accepted or {})

        try:
            accepted = await asyncio.to_thread(send)
        except ClientError as err:
            raise cc.refused(err) from None
        except (SchedulerUnavailable, Timeout) as err:
            logger.info("console: submit not served: {}", err)
            raise ApiError(503, "the scheduler is not reachable; retry", "server_error",
                           code="shutting_down") from None
        logger.bind(job=job["job_id"]).info("console: submitted a {} job", job["kind"])
        return JSONResponse({"job_id": job["job_id"], "kind": job["kind"],
                             "tier": accepted.get("tier")})

    async def cancel(self, request: Request) -> Response:
        job_id = cc.job_id_of(await self._body(request))
        await self._call("cancel", lambda c: c.cancel(job_id, timeout=CONTROL_TIMEOUT_S))
        logger.bind(job=job_id).info("console: cancelled")
        return JSONResponse({"job_id": job_id, "cancelled": True})

    async def foreground(self, request: Request) -> Response:
        kind = cc.foreground_kind(await self._body(request), self.settings.kinds)
        await self._call("foreground", lambda c: c.foreground(kind, timeout=CONTROL_TIMEOUT_S))
        return JSONResponse({"foreground": kind})

    async def lifecycle(self, request: Request) -> Response:
        state = cc.lifecycle_state(await self._body(request))
        await self._call("lifecycle", lambda c: c.lifecycle(state, timeout=CONTROL_TIMEOUT_S))
        return JSONResponse({"lifecycle": state})

    async def chaos_round(self, request: Request) -> Response:
        if request.method == "GET":
            return JSONResponse(self.chaos.view())
        await self._body(request)  # checked like every body, though nothing is read
        self._loop = asyncio.get_running_loop()
        view = self.chaos.start()
        logger.info("console: chaos round {} started at {:.0f}", self.chaos.rounds,
                    time.time())
        return JSONResponse(view, status_code=202)
