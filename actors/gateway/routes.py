"""The gateway's endpoints: chat and text completions (JSON or SSE), embeddings, models,
health. Each handler maps the request (``openai_map``), runs it through the
:class:`~uniun.actors.gateway.link.SchedulerLink` and answers in OpenAI's shapes; every
refusal is an :class:`~uniun.actors.gateway.errors.ApiError`.

Streaming: the job's start (or its refusal, by the scheduler or by the runner) is
awaited *before* the SSE response starts, so a refusal is a proper HTTP status
(400/404/429/503), never an error buried in a 200 stream. After that, tokens become ``chat.completion.chunk`` events; a
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
from collections.abc import AsyncIterator, Callable
from typing import Any

from loguru import logger
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from uniun.actors.gateway import openai_map as om
from uniun.actors.gateway.body import carriable, parse_json
from uniun.actors.gateway.errors import ApiError, from_protocol
from uniun.actors.gateway.gateway import Gateway, too_many
from uniun.actors.gateway.link import JobRun, Outcome
from uniun.protocol.client import ClientError, Timeout
from uniun.protocol.codec import EncodeError

__all__ = [
    "chat_completions",
    "completions",
    "embeddings",
    "get_model",
    "health",
    "list_models",
]

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# How the runner words a prompt it cannot start (models/session.py): the scheduler relays
# it as a non-retryable runner_failed, but it is the client's mistake, so a 400 with
# this code. The text is all the protocol carries for it today.
PROMPT_REFUSALS = {"does not fit the model's": "context_length_exceeded",
                   "the prompt has no tokens": "invalid_field"}
STARTED = frozenset({"started", "token", "done"})  # events that show the job has begun


def _sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


async def _body(request: Request, gateway: Gateway) -> Any:
    """The body as checked JSON (the door has read it within the size limit)."""
    raw = await request.body()
    if len(raw) > gateway.settings.max_body_bytes:  # the door refuses this first
        raise ApiError(413, f"request body over {gateway.settings.max_body_bytes} bytes",
                       code="bad_envelope")
    return parse_json(raw)


def _failure(outcome: Outcome) -> ApiError:
    """The HTTP error for an outcome that ends a job without ``done``."""
    if outcome.kind == "refused" and isinstance(outcome.error, ClientError):
        err = outcome.error
        return from_protocol(err.code, err.message, err.field,
                             retry_after_s=err.retry_after_s)
    if outcome.kind == "event" and outcome.data is not None:
        data = outcome.data
        message = str(data.get("message"))
        if data.get("code") == "runner_failed" and not data.get("retryable"):
            for phrase, code in PROMPT_REFUSALS.items():
                if phrase in message:  # the runner refused the prompt: the client's to fix
                    return ApiError(400, message.rsplit(": ", 1)[-1], code=code)
        return from_protocol(str(data.get("code")), message)
    if outcome.kind == "cancelled":
        return ApiError(499, "the request was cancelled", code="cancelled")
    logger.bind(job=outcome.data.get("job_id") if outcome.data else None).info(
        "HTTP request not served: {}", outcome.error)
    return ApiError(503, "the scheduler is not reachable; retry", "server_error",
                    code="shutting_down")


async def _start(gateway: Gateway, job: dict[str, Any]) -> tuple[JobRun, dict[str, Any]]:
    """Submit; return the run and its ``accepted`` reply, or raise the refusal."""
    gateway.check_open()
    carriable(job)
    link = gateway.link
    if link.open >= link.max_open:
        raise too_many(link.open, link.max_open)
    link.open += 1
    run = link.start_job(job)
    try:
        first = await run.next()
    except BaseException:  # the handler was cancelled (shutdown): stop the job, free the slot
        run.cancel()
        link.open -= 1
        raise
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


async def _watch_disconnect(request: Request, run: JobRun) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            run.cancel()
            return


async def _collect(gateway: Gateway, request: Request, run: JobRun) -> dict[str, Any]:
    """Events until ``done`` (returned) or a failure (raised); a disconnect cancels."""
    watcher = asyncio.ensure_future(_watch_disconnect(request, run))
    failure: ApiError | None = None
    done: dict[str, Any] | None = None
    try:
        while (outcome := await run.next()).kind != "end":
            if outcome.kind == "event" and outcome.data is not None:
                if outcome.data["type"] == "done":
                    done = outcome.data
                elif outcome.data["type"] == "error":
                    failure = _failure(outcome)
            elif outcome.kind != "accepted":
                failure = _failure(outcome)
    finally:
        watcher.cancel()
        gateway.link.open -= 1
        if done is None and failure is None:  # cancelled (shutdown): stop the job too
            run.cancel()
    if done is None:
        raise failure or ApiError(500, "the job ended without a result", "server_error")
    return done


async def _until_started(gateway: Gateway, request: Request, run: JobRun) -> list[Outcome]:
    """The outcomes up to the job's start (``started``, or a token or ``done`` first).

    A stream's response begins only then, so a job the runner refuses before its start
    (a prompt longer than the model's context) is an HTTP error status, not an error
    inside a 200 stream; a client waits for the headers instead of for the first token,
    which takes as long. A failure is raised (its slot given back); a client that goes
    away meanwhile cancels the job.
    """
    watcher = asyncio.ensure_future(_watch_disconnect(request, run))
    seen: list[Outcome] = []
    failure: ApiError | None = None
    try:
        while (outcome := await run.next()).kind != "end":
            if outcome.kind == "event" and outcome.data is not None \
                    and outcome.data["type"] in STARTED:
                seen.append(outcome)
                return seen
            if outcome.kind == "event" and outcome.data is not None \
                    and outcome.data["type"] != "error":
                seen.append(outcome)
            elif outcome.kind != "accepted":
                failure = failure or _failure(outcome)
        failure = failure or ApiError(503, "the job ended before it started; retry",
                                      "server_error", code="shutting_down")
    except BaseException:
        run.cancel()  # the handler was cancelled (shutdown): stop the job too
        gateway.link.open -= 1
        raise
    finally:
        watcher.cancel()
    gateway.link.open -= 1
    raise failure


async def _stream(gateway: Gateway, run: JobRun, chunk: Callable[..., dict[str, Any]],
                  first: dict[str, Any] | None, include_usage: bool,
                  accepted: dict[str, Any], pending: list[Outcome]) -> AsyncIterator[bytes]:
    """SSE of a job: ``first`` (the role chunk), text chunks, the finish, usage, [DONE].
    ``pending``: outcomes already read (by :func:`_until_started`), handled first."""
    ended = False

    async def outcomes() -> AsyncIterator[Outcome]:
        for outcome in pending:
            yield outcome
        while (outcome := await run.next()).kind != "end":
            yield outcome

    try:
        if first is not None:
            yield _sse(first)
        async for outcome in outcomes():
            event = outcome.data if outcome.kind == "event" else None
            if event is None:
                if outcome.kind != "accepted":
                    yield _sse(_failure(outcome).body())
                continue
            if event["type"] == "token" and event["text"]:
                yield _sse(chunk(text=event["text"]))
            elif event["type"] == "done":
                last = chunk(finish_reason=event.get("finish_reason", "stop"))
                last["uniun"] = om.uniun_info(event, accepted)  # extension: job id, tier, ...
                yield _sse(last)
                if include_usage:
                    yield _sse(chunk(usage=om.usage_of(event), final_usage=True))
                yield b"data: [DONE]\n\n"
            elif event["type"] == "error":
                yield _sse(_failure(outcome).body())
        ended = True
    finally:
        # No await in here: a cancelled scope (the client went away) cancels every await.
        gateway.link.open -= 1
        if not ended:  # the client went away (Starlette cancelled us): cancel the job
            run.cancel()
            logger.bind(job=run.job_id).info("HTTP client disconnected; cancelling its job")


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
    run, accepted = await _start(gateway, req.job)
    created = int(time.time())
    if not req.stream:
        done = await _collect(gateway, request, run)
        make = om.chat_response if chat else om.completion_response
        return JSONResponse(make(req, done, created, accepted))

    def chunk(text: str = "", finish_reason: str | None = None,
              usage: dict[str, int] | None = None, final_usage: bool = False) -> dict[str, Any]:
        if chat:
            return om.chat_chunk(req, created, content=None if finish_reason else text,
                                 finish_reason=finish_reason, usage=usage,
                                 final_usage=final_usage)
        return om.completion_chunk(req, created, text=text, finish_reason=finish_reason,
                                   usage=usage, final_usage=final_usage)

    pending = await _until_started(gateway, request, run)
    first = om.chat_chunk(req, created, role=True, content="") if chat else None
    return StreamingResponse(_stream(gateway, run, chunk, first, req.include_usage, accepted,
                                     pending),
                             media_type="text/event-stream", headers=SSE_HEADERS)


async def embeddings(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    body = await _body(request, gateway)
    texts = om.embedding_texts(body, model=gateway.settings.embed_model)
    gateway.check_open()
    with gateway.slot():  # embedding requests count against max_open_requests too
        vectors = await _embed(gateway, texts)
        # The tokenizer runs in a thread: a 256-text request must not stall the loop.
        tokens = await asyncio.to_thread(gateway.count_embed_tokens, texts)
    base64_out = body.get("encoding_format") == "base64"
    data = []
    for i, row in enumerate(vectors):
        vector: Any = (base64.b64encode(row.astype("<f4").tobytes()).decode() if base64_out
                       else [float(x) for x in row])
        data.append({"object": "embedding", "index": i, "embedding": vector})
    return JSONResponse({"object": "list", "data": data, "model": gateway.settings.embed_model,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def _embed(gateway: Gateway, texts: list[str]) -> Any:
    """The pool's vectors, or the refusal as an HTTP error with nothing internal in it."""
    try:
        return await gateway.link.embed(texts)
    except EncodeError as err:  # texts over the frame limit
        raise ApiError(400, f"the request cannot be sent to the embedding pool: {err}",
                       param="input", code="bad_envelope") from None
    except ClientError as err:
        if err.code == "unknown_model":  # the pool's own model is missing: our side
            logger.warning("embedding request refused: {}", err.message)
            raise ApiError(503, "the embedding model is not available on this runtime",
                           "server_error", code="shutting_down") from None
        raise from_protocol(err.code, err.message, err.field,
                            retry_after_s=err.retry_after_s) from None
    except (ConnectionError, Timeout) as err:  # no pool, or it did not answer in time
        logger.warning("embedding request not served: {}", err)
        raise ApiError(503, "the embedding pool is not reachable; retry", "server_error",
                       code="shutting_down") from None


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
