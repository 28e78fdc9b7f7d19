"""The gateway's endpoints: chat and text completions (JSON or SSE), embeddings, models,
health. Each handler maps the request (``openai_map``), runs it through the
:class:`~uniun.actors.gateway.link.SchedulerLink` and answers in OpenAI's shapes; every
refusal is an :class:`~uniun.actors.gateway.errors.ApiError`.

A request with ``n`` > 1 runs ``n`` jobs (``JobRequest.jobs``), each accepted before any
answer; each has a :class:`~uniun.actors.gateway.choices.Choice` that turns its events
into its part of the response (text, tool calls, log-probabilities).

Streaming: the (first) job's start (or its refusal, by the scheduler or by the runner) is
awaited *before* the SSE response starts, so a refusal is a proper HTTP status
(400/404/429/503), never an error buried in a 200 stream. After that, tokens become
``chat.completion.chunk`` events, the jobs' interleaved as they come, each with its
choice's ``index``; a ``paused`` (the job was preempted) sends nothing, so the client
sees a slower stream; an ``error`` event becomes ``data: {"error": ...}`` and the stream
ends without ``[DONE]`` (the request's other jobs are cancelled). A client that
disconnects cancels its jobs: Starlette cancels the streaming generator (or, for a
non-streamed request, :func:`_watch_disconnect` sees ``http.disconnect``).
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

from uniun.actors.gateway import openai_map as om, openai_responses as orsp
from uniun.actors.gateway.body import carriable, parse_json
from uniun.actors.gateway.choices import Choice
from uniun.actors.gateway.clients import Ticket, client_of, job_client
from uniun.actors.gateway.errors import ApiError, from_protocol
from uniun.actors.gateway.gateway import Gateway
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


async def _start(gateway: Gateway, ticket: Ticket, job: dict[str, Any]
                 ) -> tuple[JobRun, dict[str, Any]]:
    """Take a slot on ``ticket`` (429 at a bound) and submit; return the run and its
    ``accepted`` reply, or raise the refusal (the slot given back)."""
    gateway.check_open()
    job = {**job, "client": job_client(ticket.client)}  # whose share it is (T0)
    carriable(job)
    ticket.take()
    run = gateway.link.start_job(job)
    try:
        first = await run.next()
    except BaseException:  # the handler was cancelled (shutdown): stop the job, free the slot
        run.cancel()
        ticket.give_back()
        raise
    if first.kind != "accepted":
        await _drain(run)
        ticket.give_back()
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


async def _collect(ticket: Ticket, request: Request, runs: list[JobRun],
                   choices: list[Choice]) -> list[dict[str, Any]]:
    """Every job's ``done`` (returned, in order) or the first failure (raised); a
    disconnect cancels them all."""
    watcher = asyncio.ensure_future(_watch_disconnect(request, runs))
    results: list[tuple[dict[str, Any] | None, ApiError | None]] = []
    try:
        results = list(await asyncio.gather(*(_events(r, c) for r, c in zip(runs, choices))))
    finally:
        watcher.cancel()
        ticket.give_back(len(runs))
        if len(results) < len(runs):  # cancelled (shutdown): stop the jobs too
            for run in runs:
                run.cancel()
    dones = [done for done, _ in results]
    if any(done is None for done in dones):
        failure = next((f for _, f in results if f is not None), None)
        raise failure or ApiError(500, "the job ended without a result", "server_error")
    return dones  # type: ignore[return-value]


async def _until_started(ticket: Ticket, request: Request, run: JobRun) -> list[Outcome]:
    """The outcomes up to the job's start (``started``, or a token or ``done`` first).

    A stream's response begins only then, so a job the runner refuses before its start
    (a prompt longer than the model's context) is an HTTP error status, not an error
    inside a 200 stream; a client waits for the headers instead of for the first token,
    which takes as long. A failure is raised (its slot given back); a client that goes
    away meanwhile cancels the job.
    """
    watcher = asyncio.ensure_future(_watch_disconnect(request, [run]))
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
        ticket.give_back()
        raise
    finally:
        watcher.cancel()
    ticket.give_back()
    raise failure


async def _merged(runs: list[JobRun], pending: list[Outcome]
                  ) -> AsyncIterator[tuple[int, Outcome]]:
    """The outcomes of several jobs as they come, each with its job's index; ``pending``:
    the first job's outcomes already read (by :func:`_until_started`), first."""
    for outcome in pending:
        yield 0, outcome
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


async def _stream(ticket: Ticket, req: om.JobRequest, runs: list[JobRun],
                  choices: list[Choice], accepted: list[dict[str, Any]], created: int,
                  pending: list[Outcome], *, chat: bool) -> AsyncIterator[bytes]:
    """SSE of a request's jobs: the role chunks, the choices' chunks as their tokens come,
    each choice's finish, the usage, [DONE]; a job's failure ends the stream (no [DONE])."""
    finished = False
    dones: dict[int, dict[str, Any]] = {}
    try:
        if chat:
            for i in range(len(runs)):
                yield _sse(orsp.role_chunk(req, created, i))
        async for i, outcome in _merged(runs, pending):
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
        ticket.give_back(len(runs))
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
    ticket = gateway.requests.ticket(client_of(request),
                                     chat=req.job["kind"] == gateway.settings.chat_kind)
    try:
        for job in req.jobs():  # n jobs: each refused or accepted before any answer
            started.append(await _start(gateway, ticket, job))
    except BaseException:
        for run, _ in started:  # the ones already accepted are not wanted any more
            run.cancel()
            ticket.give_back()
        raise
    runs = [run for run, _ in started]
    accepted = [a for _, a in started]
    choices = [Choice(i, run.job_id, chat=chat, tools=req.tools, logprobs=req.logprobs)
               for i, run in enumerate(runs)]
    created = int(time.time())
    if not req.stream:
        dones = await _collect(ticket, request, runs, choices)
        return JSONResponse(orsp.response(req, choices, dones, created, accepted, chat=chat))
    # The first job's start is awaited before the response begins (its refusal is then an
    # HTTP status); its siblings share its prompt, so the runner would refuse them alike.
    try:
        pending = await _until_started(ticket, request, runs[0])
    except BaseException:
        for run in runs[1:]:
            run.cancel()
            ticket.give_back()
        raise
    return StreamingResponse(_stream(ticket, req, runs, choices, accepted, created, pending,
                                     chat=chat),
                             media_type="text/event-stream", headers=SSE_HEADERS)


async def embeddings(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    body = await _body(request, gateway)
    texts = om.embedding_texts(body, model=gateway.settings.embed_model)
    gateway.check_open()
    with gateway.slot(client_of(request)):  # embedding requests hold a slot too
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
