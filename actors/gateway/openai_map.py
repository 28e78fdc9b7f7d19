"""OpenAI request bodies -> protocol v1 job maps, and job events -> OpenAI responses.

The gateway is a translator: every OpenAI field either maps onto a field of the job map
(PROTOCOL.md, plus the ``stop`` and ``format`` extensions), is refused with a 400 because
honouring it is impossible here and ignoring it would change the answer (``n > 1``,
``tools``, ``logprobs``, ``logit_bias``, audio), or is ignored because it is a hint or
bookkeeping (``user``, ``metadata``, ``store``, penalties, ...). docs/http.md has the
table; :data:`IGNORED_CHAT_FIELDS` and friends are the code behind it.

The ``uniun`` extension field carries the protocol's scheduling fields: a request is a
``chat`` (T0) unless it says ``"uniun": {"kind": "nataraj", ...}``.

Pure: no I/O, no clock of its own (``now`` is passed in).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from uniun.actors.gateway.errors import ApiError, bad_request
from uniun.protocol.jobmap import MAX_JOB_ID_CHARS

__all__ = [
    "IGNORED_CHAT_FIELDS",
    "UNIUN_FIELDS",
    "JobRequest",
    "chat_chunk",
    "chat_job",
    "chat_response",
    "completion_chunk",
    "completion_job",
    "completion_response",
    "embedding_texts",
    "uniun_info",
    "usage_of",
]

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
IGNORED_CHAT_FIELDS = frozenset({
    "user", "metadata", "store", "service_tier", "presence_penalty", "frequency_penalty",
    "parallel_tool_calls", "reasoning_effort", "prediction", "web_search_options",
    "safety_identifier", "prompt_cache_key", "verbosity", "top_logprobs", "tool_choice",
})
UNIUN_FIELDS = frozenset({"kind", "flow", "deadline", "deadline_in_s", "foreground_hint",
                          "job_id", "top_k"})
MAX_TEMPERATURE = 2.0  # OpenAI's range; the protocol accepts up to 10


@dataclass(frozen=True)
class JobRequest:
    """A validated request: the job map to submit and how to answer."""

    job: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    object_id: str  # chatcmpl-... / cmpl-...


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require_object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required (GET /v1/models lists them)", "model")
    return model


def _content(value: Any, i: int) -> str:
    """A message's content: a string, or a list of text parts (joined)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise bad_request("only text content parts are supported",
                                  f"messages[{i}].content[{j}]")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request("content must be a string or a list of text parts",
                      f"messages[{i}].content")


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise bad_request("messages must be a non-empty list", "messages")
    out = []
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise bad_request("each message must be an object", f"messages[{i}]")
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad_request(f"role {role!r} is not supported (system, developer, user, "
                              "assistant)", f"messages[{i}].role")
        if msg.get("tool_calls"):
            raise bad_request("tool calls are not supported", f"messages[{i}].tool_calls")
        out.append({"role": ROLES[role], "content": _content(msg.get("content"), i)})
    return out


def _sampling(body: Mapping[str, Any], ext: Mapping[str, Any]) -> dict[str, Any]:
    temperature = body.get("temperature")
    if temperature is None:
        temperature = 1.0  # OpenAI's default
    if not _is_number(temperature) or not 0 <= temperature <= MAX_TEMPERATURE:
        raise bad_request(f"temperature must be a number in [0, {MAX_TEMPERATURE:g}]",
                          "temperature")
    sampling: dict[str, Any] = {"temperature": float(temperature)}
    top_p = body.get("top_p")
    if top_p is not None:
        if not _is_number(top_p) or not 0 < top_p <= 1:
            raise bad_request("top_p must be a number in (0, 1]", "top_p")
        sampling["top_p"] = float(top_p)
    seed = body.get("seed")
    if seed is not None:
        if not _is_int(seed) or not 0 <= seed < 2**63:
            raise bad_request("seed must be an integer in [0, 2^63)", "seed")
        sampling["seed"] = seed
    if ext.get("top_k") is not None:
        if not _is_int(ext["top_k"]) or ext["top_k"] < 0:
            raise bad_request("uniun.top_k must be an integer >= 0", "uniun.top_k")
        sampling["top_k"] = ext["top_k"]
    return sampling


def _max_tokens(body: Mapping[str, Any], default: int) -> int:
    value = body.get("max_completion_tokens")
    name = "max_completion_tokens"
    if value is None:
        value, name = body.get("max_tokens"), "max_tokens"
    if value is None:
        return default
    if not _is_int(value) or value < 1:
        raise bad_request(f"{name} must be an integer >= 1", name)
    return value


def _stop(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value) \
            or len(value) > 4:
        raise bad_request("stop must be a string or a list of at most 4 strings", "stop")
    return value


def _response_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request("response_format must be an object", "response_format")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise bad_request("response_format.json_schema.schema must be a JSON Schema object",
                              "response_format.json_schema.schema")
        return {"type": "json_schema", "schema": spec["schema"]}
    raise bad_request("response_format.type must be text, json_object or json_schema",
                      "response_format.type")


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    """Fields whose meaning cannot be honoured: refusing beats a silently different answer."""
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_request("only n=1 is supported", "n")
    if body.get("tools") or body.get("functions"):
        raise bad_request("tools and functions are not supported", "tools")
    if body.get("logprobs"):
        raise bad_request("logprobs are not supported", "logprobs")
    if body.get("logit_bias"):
        raise bad_request("logit_bias is not supported", "logit_bias")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad_request("only the text modality is supported", "modalities")
    if body.get("audio"):
        raise bad_request("audio output is not supported", "audio")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise bad_request("only best_of=1 is supported", "best_of")
    if body.get("echo"):
        raise bad_request("echo is not supported", "echo")
    if body.get("suffix"):
        raise bad_request("suffix is not supported", "suffix")


def _scheduling(ext: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The ``uniun`` extension's job fields (validated again, fully, by the scheduler)."""
    unknown = sorted(set(ext) - UNIUN_FIELDS)
    if unknown:
        raise bad_request(f"unknown uniun field {unknown[0]!r} (known: "
                          f"{', '.join(sorted(UNIUN_FIELDS))})", f"uniun.{unknown[0]}")
    job: dict[str, Any] = {"kind": ext.get("kind", "chat")}
    job_id = ext.get("job_id")
    if job_id is not None and (not isinstance(job_id, str) or not job_id
                               or len(job_id) > MAX_JOB_ID_CHARS):
        # The protocol client keys its streams by job id before the scheduler sees it.
        raise bad_request(f"uniun.job_id must be a string of 1-{MAX_JOB_ID_CHARS} "
                          "characters", "uniun.job_id")
    for key in ("flow", "foreground_hint", "job_id", "deadline"):
        if ext.get(key) is not None:
            job[key] = ext[key]
    if ext.get("deadline_in_s") is not None:
        if not _is_number(ext["deadline_in_s"]) or ext["deadline_in_s"] < 0:
            raise bad_request("uniun.deadline_in_s must be a number >= 0", "uniun.deadline_in_s")
        job["deadline"] = now + float(ext["deadline_in_s"])
    return job


def _common(body: Mapping[str, Any], *, default_max_tokens: int, now: float) -> tuple[dict[str, Any], str, bool, bool]:
    _refuse_unsupported(body)
    model = _model(body)
    ext = body.get("uniun") or {}
    if not isinstance(ext, dict):
        raise bad_request("uniun must be an object of protocol job fields", "uniun")
    job = _scheduling(ext, now)
    job.setdefault("job_id", f"http-{uuid.uuid4().hex}")
    job["model_id"] = model
    job["max_new_tokens"] = _max_tokens(body, default_max_tokens)
    job["sampling"] = _sampling(body, ext)
    stop = _stop(body.get("stop"))
    if stop:
        job["stop"] = stop
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("stream must be a boolean", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    return job, model, stream, bool(options.get("include_usage", False))


def chat_job(body: Any, *, default_max_tokens: int, now: float) -> JobRequest:
    """``POST /v1/chat/completions`` as a job map (raises :class:`ApiError` 400)."""
    body = _require_object(body)
    job, model, stream, usage = _common(body, default_max_tokens=default_max_tokens, now=now)
    job["messages"] = _messages(body.get("messages"))
    fmt = _response_format(body.get("response_format"))
    if fmt is not None:
        job["format"] = fmt
    return JobRequest(job, model, stream, usage, f"chatcmpl-{job['job_id']}")


def completion_job(body: Any, *, default_max_tokens: int, now: float) -> JobRequest:
    """``POST /v1/completions`` (a raw prompt) as a job map."""
    body = _require_object(body)
    job, model, stream, usage = _common(body, default_max_tokens=default_max_tokens, now=now)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise bad_request("prompt must be a non-empty string (one prompt per request)", "prompt")
    job["prompt"] = prompt
    return JobRequest(job, model, stream, usage, f"cmpl-{job['job_id']}")


def embedding_texts(body: Any, *, model: str, max_texts: int = 256) -> list[str]:
    """``POST /v1/embeddings``: the texts to embed (the pool has one model, ``model``)."""
    body = _require_object(body)
    asked = _model(body)
    if asked != model:
        raise ApiError(404, f"the embedding model is {model!r}, not {asked!r}",
                       "invalid_request_error", "model", "model_not_found")
    if body.get("encoding_format") not in (None, "float", "base64"):
        raise bad_request("encoding_format must be float or base64", "encoding_format")
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise bad_request("input must be a string or a non-empty list of strings "
                          "(token arrays are not supported)", "input")
    if len(texts) > max_texts:
        raise bad_request(f"at most {max_texts} inputs per request", "input")
    return texts


# -- responses ------------------------------------------------------------------------

def usage_of(done: Mapping[str, Any]) -> dict[str, int]:
    usage = done.get("usage") or {}
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def uniun_info(done: Mapping[str, Any], accepted: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"job_id": done.get("job_id"), "tier": (accepted or {}).get("tier"),
            "preemptions": done.get("preemptions", 0), "timings": done.get("timings")}


def chat_response(req: JobRequest, done: Mapping[str, Any], created: int,
                  accepted: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"id": req.object_id, "object": "chat.completion", "created": created,
            "model": req.model, "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": done["text"],
                                                 "refusal": None},
                         "logprobs": None, "finish_reason": done.get("finish_reason", "stop")}],
            "usage": usage_of(done), "uniun": uniun_info(done, accepted)}


def chat_chunk(req: JobRequest, created: int, *, content: str | None = None,
               role: bool = False, finish_reason: str | None = None,
               usage: dict[str, int] | None = None, final_usage: bool = False) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``final_usage``: the usage-only chunk (no choices)."""
    chunk: dict[str, Any] = {"id": req.object_id, "object": "chat.completion.chunk",
                             "created": created, "model": req.model, "system_fingerprint": None}
    if final_usage:
        chunk["choices"] = []
        chunk["usage"] = usage
        return chunk
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    chunk["choices"] = [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": finish_reason}]
    if req.include_usage:
        chunk["usage"] = None
    return chunk


def completion_response(req: JobRequest, done: Mapping[str, Any], created: int,
                        accepted: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"id": req.object_id, "object": "text_completion", "created": created,
            "model": req.model, "system_fingerprint": None,
            "choices": [{"index": 0, "text": done["text"], "logprobs": None,
                         "finish_reason": done.get("finish_reason", "stop")}],
            "usage": usage_of(done), "uniun": uniun_info(done, accepted)}


def completion_chunk(req: JobRequest, created: int, *, text: str = "",
                     finish_reason: str | None = None, usage: dict[str, int] | None = None,
                     final_usage: bool = False) -> dict[str, Any]:
    chunk: dict[str, Any] = {"id": req.object_id, "object": "text_completion",
                             "created": created, "model": req.model, "system_fingerprint": None}
    if final_usage:
        chunk["choices"] = []
        chunk["usage"] = usage
        return chunk
    chunk["choices"] = [{"index": 0, "text": text, "logprobs": None,
                         "finish_reason": finish_reason}]
    if req.include_usage:
        chunk["usage"] = None
    return chunk
