"""The gateway's endpoints: chat and text completions (JSON or SSE), embeddings, models,
health. Each handler maps the request (``openai_map``), runs it through the
:class:`~uniun.actors.gateway.link.SchedulerLink` and answers in OpenAI's shapes; every
refusal is an :class:`~uniun.actors.gateway.errors.ApiError`.

Streaming: the job's first outcome (accepted or refused) is awaited *before* the SSE
response starts, so a refusal is a proper HTTP status (400/404/429/503), never an error
buried in a 200 stream. After that, tokens become ``chat.completion.chunk`` events; a
``paused`` (the job was preempted) sends nothing, so the client sees a slower stream; an
``error`` event becomes ``data: {"error": ...}`` and the stream ends without ``[DONE]``.
A client that disconnects cancels its job: Starlette cancels the streaming generator
(or, for a non-streamed request, :func:`_watch_disconnect` sees ``http.disconnect``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from loguru import logger
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from uniun.actors.gateway import openai_map as om
from uniun.actors.gateway import openai_responses as orsp
from uniun.actors.gateway.choices import Choice
from uniun.actors.gateway.errors import ApiError, from_protocol
from uniun.actors.gateway.gateway import Gateway
from uniun.actors.gateway.link import JobRun, Outcome
from uniun.protocol.client import ClientError

__all__ = ["chat_completions", "completions", "embeddings", "list_models", "get_model",
           "health"]

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


async def _body(request: Request, gateway: Gateway) -> Any:
    raw = await request.body()
    if len(raw) > gateway.settings.max_body_bytes:
        raise ApiError(413, f"request body over {gateway.settings.max_body_bytes} bytes",
                       code="bad_envelope")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the body is not JSON: {err}", code="bad_envelope") from None


def _failure(outcome: Outcome) -> ApiError:
    """The HTTP error for an outcome that ends a job without ``done``."""
    if outcome.kind == "refused" and isinstance(outcome.error, ClientError):
        err = outcome.error
        return from_protocol(err.code, err.message, err.field)
    if outcome.kind == "event" and outcome.data is not None:
        return from_protocol(str(outcome.data.get("code")), str(outcome.data.get("message")))
    if outcome.kind == "cancelled":
        return ApiError(499, "the request was cancelled", code="cancelled")
    return ApiError(503, f"the scheduler is not reachable ({outcome.error})", "server_error",
                    code="shutting_down")


async def _start(gateway: Gateway, job: dict[str, Any]) -> tuple[JobRun, dict[str, Any]]:
    """Submit; return the run and its ``accepted`` reply, or raise the refusal."""
    gateway.check_open()
    link = gateway.link
    if link.open >= link.max_open:
        raise ApiError(429, f"{link.open} requests are open at the gateway (the cap is "
                            f"{link.max_open}); retry later", "rate_limit_error",
                       code="queue_full")
    link.open += 1
    run = link.start_job(job)
    first = await run.next()
    if first.kind != "accepted":
        await _drain(run)
        link.open -= 1
        raise _failure(first)
    return run, first.data or {}


async def _drain(run: JobRun) -> None:
    """Wait for the worker's last outcome (its client is then back in the pool)."""
    outcome = await run.next()
    while outcome.kind != "end":
        outcome = await run.next()


async def _watch_disconnect(request: Request, runs: list[JobRun]) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            for run in runs:
                run.cancel()
            return


async def _events(run: JobRun, choice: Choice) -> tuple[dict[str, Any] | None,
                                                         ApiError | None]:
    """One job's events until its end: its ``done`` or its failure (tokens go to its
    choice, for the log-probabilities)."""
    failure: ApiError | None = None
    done: dict[str, Any] | None = None
    while (outcome := await run.next()).kind != "end":
        if outcome.kind == "event" and outcome.data is not None:
            if outcome.data["type"] == "token":
                choice.on_token(outcome.data)
            elif outcome.data["type"] == "done":
                done = outcome.data
            elif outcome.data["type"] == "error":
                failure = _failure(outcome)
        elif outcome.kind != "accepted":
            failure = _failure(outcome)
    return done, failure


async def _collect(gateway: Gateway, request: Request, runs: list[JobRun],
                   choices: list[Choice]) -> list[dict[str, Any]]:
    """Every job's ``done`` (returned, in order) or the first failure (raised); a
    disconnect cancels them all."""
    watcher = asyncio.ensure_future(_watch_disconnect(request, runs))
    results: list[tuple[dict[str, Any] | None, ApiError | None]] = []
    try:
        results = list(await asyncio.gather(*(_events(r, c) for r, c in zip(runs, choices))))
    finally:
        watcher.cancel()
        gateway.link.open -= len(runs)
        if len(results) < len(runs):  # cancelled (shutdown): stop the jobs too
            for run in runs:
                run.cancel()
    dones = [done for done, _ in results]
    if any(done is None for done in dones):
        failure = next((f for _, f in results if f is not None), None)
        raise failure or ApiError(500, "the job ended without a result", "server_error")
    return dones  # type: ignore[return-value]


async def _merged(runs: list[JobRun]) -> AsyncIterator[tuple[int, Outcome]]:
    """The outcomes of several jobs as they come, each with its job's index."""
    queue: asyncio.Queue[tuple[int, Outcome]] = asyncio.Queue()

    async def pump(i: int, run: JobRun) -> None:
        while True:
            outcome = await run.next()
            queue.put_nowait((i, outcome))
            if outcome.kind == "end":
                return

    tasks = [asyncio.ensure_future(pump(i, run)) for i, run in enumerate(runs)]
    try:
        ended = 0
        while ended < len(runs):
            i, outcome = await queue.get()
            if outcome.kind == "end":
                ended += 1
                continue
            yield i, outcome
    finally:
        for task in tasks:
            task.cancel()


async def _stream(gateway: Gateway, req: om.JobRequest, runs: list[JobRun],
                  choices: list[Choice], accepted: list[dict[str, Any]], created: int, *,
                  chat: bool) -> AsyncIterator[bytes]:
    """SSE of a request's jobs: the role chunks, the choices' chunks as their tokens come,
    each choice's finish, the usage, [DONE]; a job's failure ends the stream (no [DONE])."""
    finished = False
    dones: dict[int, dict[str, Any]] = {}
    try:
        if chat:
            for i in range(len(runs)):
                yield _sse(orsp.role_chunk(req, created, i))
        async for i, outcome in _merged(runs):
            event = outcome.data if outcome.kind == "event" else None
            if event is None:
                if outcome.kind != "accepted":
                    yield _sse(_failure(outcome).body())
                    break
                continue
            if event["type"] == "token":
                entries = choices[i].on_token(event)
                if entries:
                    yield _sse(orsp.chunk(req, created, entries, chat=chat))
            elif event["type"] == "done":
                dones[i] = event
                last = orsp.chunk(req, created, choices[i].on_done(event), chat=chat)
                last["uniun"] = orsp.uniun_info([event], [accepted[i]])  # job id, tier, ...
                yield _sse(last)
            elif event["type"] == "error":
                yield _sse(_failure(outcome).body())
                break
        else:
            if req.include_usage:
                yield _sse(orsp.usage_chunk(req, created, [dones[i] for i in sorted(dones)],
                                            chat=chat))
            yield b"data: [DONE]\n\n"
        finished = True
    finally:
        # No await in here: a cancelled scope (the client went away) cancels every await.
        gateway.link.open -= len(runs)
        if not finished or len(dones) < len(runs):  # gone away, or one job failed
            for run in runs:
                run.cancel()
            if not finished:
                logger.bind(job=runs[0].job_id).info(
                    "HTTP client disconnected; cancelling its job(s)")


async def chat_completions(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    req = om.chat_job(await _body(request, gateway),
                      default_max_tokens=gateway.settings.default_max_tokens, now=time.time())
    return await _complete(gateway, request, req, chat=True)


async def completions(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    req = om.completion_job(await _body(request, gateway),
                            default_max_tokens=gateway.settings.default_completion_tokens,
                            now=time.time())
    return await _complete(gateway, request, req, chat=False)


async def _complete(gateway: Gateway, request: Request, req: om.JobRequest, *,
                    chat: bool) -> Response:
    started: list[tuple[JobRun, dict[str, Any]]] = []
    try:
        for job in req.jobs():  # n jobs: each refused or accepted before any answer
            started.append(await _start(gateway, job))
    except BaseException:
        for run, _ in started:  # the ones already accepted are not wanted any more
            run.cancel()
            gateway.link.open -= 1
        raise
    runs = [run for run, _ in started]
    accepted = [a for _, a in started]
    choices = [Choice(i, run.job_id, chat=chat, tools=req.tools, logprobs=req.logprobs)
               for i, run in enumerate(runs)]
    created = int(time.time())
    if not req.stream:
        dones = await _collect(gateway, request, runs, choices)
        return JSONResponse(orsp.response(req, choices, dones, created, accepted, chat=chat))
    return StreamingResponse(_stream(gateway, req, runs, choices, accepted, created,
                                     chat=chat),
                             media_type="text/event-stream", headers=SSE_HEADERS)


async def embeddings(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    body = await _body(request, gateway)
    texts = om.embedding_texts(body, model=gateway.settings.embed_model)
    gateway.check_open()
    try:
        vectors = await gateway.link.embed(texts)
    except ClientError as err:
        raise from_protocol(err.code, err.message, err.field) from None
    except ConnectionError as err:  # no pool (EmbedUnavailable, SchedulerUnavailable)
        raise ApiError(503, str(err), "server_error", code="shutting_down") from None
    base64_out = body.get("encoding_format") == "base64"
    data = []
    for i, row in enumerate(vectors):
        vector: Any = (base64.b64encode(row.astype("<f4").tobytes()).decode() if base64_out
                       else [float(x) for x in row])
        data.append({"object": "embedding", "index": i, "embedding": vector})
    tokens = gateway.count_embed_tokens(texts)
    return JSONResponse({"object": "list", "data": data, "model": gateway.settings.embed_model,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def list_models(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    return JSONResponse({"object": "list", "data": gateway.models()})


async def get_model(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    wanted = request.path_params["model"]
    for model in gateway.models():
        if model["id"] == wanted:
            return JSONResponse(model)
    raise ApiError(404, f"no model {wanted!r} in the store", param="model",
                   code="model_not_found")


async def health(request: Request) -> Response:
    """200 only when a chat would be answered: scheduler up, a runner connected."""
    gateway: Gateway = request.app.state.gateway
    ready, reason = await gateway.readiness()
    body = {"status": "ok" if ready else "unavailable", "reason": reason}
    return JSONResponse(body, status_code=200 if ready else 503)
