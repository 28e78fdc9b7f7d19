"""OpenAI request bodies -> protocol v1 job maps, and job events -> OpenAI responses.

The gateway is a translator: every OpenAI field either maps onto a field of the job map
(docs/protocol.md, with its extensions: ``stop``, ``format``, the sampling controls,
``logprobs``, ``tools``), is refused with a 400 because honouring it is impossible here
and ignoring it would change the answer (``logit_bias``, audio, ``reasoning_effort``,
web search, and the answer-changing extensions of other servers in
:data:`REFUSED_EXTENSIONS`), or is ignored because it is bookkeeping or changes no
answer (``user``, ``metadata``, ``store``, ``prediction``, ...). docs/http.md has the
table; :data:`IGNORED_CHAT_FIELDS` and friends are the code behind it.

Sampling: what a request does not say takes the model's chat defaults (``defaults:
"model"``, docs/models.md), not OpenAI's temperature 1: a client that says nothing gets
the sampling the model reads best with, and a repetition penalty that stops a small
model's loops. ``n`` up to :data:`MAX_N` runs that many jobs (``routes.py``).

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
from uniun.actors.gateway.openai_tools import parse_tool_message, tool_fields
from uniun.protocol.jobmap import MAX_JOB_ID_CHARS
from uniun.protocol.sampling_fields import CONTROLS, Control, is_int, is_number

__all__ = [
    "IGNORED_CHAT_FIELDS",
    "MAX_N",
    "REFUSED_EXTENSIONS",
    "UNIUN_FIELDS",
    "JobRequest",
    "chat_job",
    "completion_job",
    "embedding_texts",
]

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "tool"}
# Bookkeeping, or no change to the answer (``prediction`` only speeds a known answer up).
IGNORED_CHAT_FIELDS = frozenset({
    "user", "metadata", "store", "service_tier", "prediction", "safety_identifier",
    "prompt_cache_key",
})
# Other servers' answer-changing extensions this one does not implement: refused by name
# rather than ignored, so a client moved over from llama.cpp's server or vLLM is told.
REFUSED_EXTENSIONS = frozenset({
    "grammar", "json_schema", "guided_json", "guided_regex", "guided_choice",
    "guided_grammar", "min_tokens", "ignore_eos", "mirostat", "mirostat_tau",
    "mirostat_eta", "typical_p", "tfs_z", "dry_multiplier", "dry_base", "dry_allowed_length",
    "dry_penalty_last_n", "xtc_probability", "xtc_threshold", "top_n_sigma",
    "dynatemp_range", "dynatemp_exponent", "length_penalty", "use_beam_search",
    "stop_token_ids", "bad_words", "allowed_token_ids", "n_probs", "penalize_nl",
    "prompt_logprobs",
})
UNIUN_SAMPLING = ("top_k",)  # sampling controls the ``uniun`` extension takes too
UNIUN_FIELDS = frozenset({"kind", "flow", "deadline", "deadline_in_s", "foreground_hint",
                          "job_id", *UNIUN_SAMPLING})
MAX_N = 8  # choices per request, each a job of its own
MAX_TOP_LOGPROBS = 20  # OpenAI's cap (chat); legacy completions' logprobs too


@dataclass(frozen=True)
class JobRequest:
    """A validated request: the job map to submit and how to answer.

    ``n`` > 1: :meth:`jobs` gives one job map per choice (their own ids and seeds, one
    flow, the prompt's KV shared through ``cache_prompt``)."""

    job: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    object_id: str  # chatcmpl-... / cmpl-...
    n: int = 1
    logprobs: int | None = None  # None: not asked; else alternatives per token
    tools: bool = False  # the model may call a tool (tools given, tool_choice not none)

    def jobs(self) -> list[dict[str, Any]]:
        if self.n == 1:
            return [self.job]
        out = []
        for i in range(self.n):
            job = {**self.job, "job_id": f"{self.job['job_id']}-{i}", "cache_prompt": True}
            job.setdefault("flow", f"{self.job['job_id']}")  # one fair-pool flow
            sampling = dict(job.get("sampling") or {})
            if sampling.get("seed") is not None:
                sampling["seed"] = (sampling["seed"] + i) % 2**63  # each its own seed
            job["sampling"] = sampling
            out.append(job)
        return out


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


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise bad_request("messages must be a non-empty list", "messages")
    out = []
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise bad_request("each message must be an object", f"messages[{i}]")
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad_request(f"role {role!r} is not supported (system, developer, user, "
                              "assistant, tool)", f"messages[{i}].role")
        content = _content(msg.get("content"), i)
        if role == "tool" or (role == "assistant" and msg.get("tool_calls")):
            out.append(parse_tool_message(msg, i, content))
        else:
            out.append({"role": ROLES[role], "content": content})
    return out


def _control(control: Control, value: Any, where: str) -> int | float:
    """One sampling control's value as the OpenAI dialect takes it (``where``: its name
    in the request), refused with the range the wire's error names too."""
    high = control.openai_high
    if not control.admits(value, high=high):
        raise bad_request(f"{where} {control.rule(high=high)}", where)
    return control.typed(value)


def _sampling(body: Mapping[str, Any], ext: Mapping[str, Any]) -> dict[str, Any]:
    """The job's ``sampling``: what the request gives; the rest from the model's chat
    defaults. Every control of ``protocol/sampling_fields.py`` is taken at the top level
    under its OpenAI names: OpenAI's own, and the extensions vLLM's and llama.cpp's
    servers take there (``top_k``, ``min_p``, ``repetition_penalty`` or
    ``repeat_penalty``, ``repeat_last_n``); ``top_k`` also in the ``uniun`` extension."""
    sampling: dict[str, Any] = {"defaults": "model"}
    for key, control in CONTROLS.items():
        given = [(name, _control(control, body[name], name))
                 for name in control.openai_names if body.get(name) is not None]
        if len({value for _, value in given}) > 1:
            names = [name for name, _ in given]
            raise bad_request(f"{' and '.join(names)} differ (they are one control)",
                              names[-1])
        if given:
            sampling[key] = given[0][1]
        if key in UNIUN_SAMPLING and ext.get(key) is not None:
            sampling[key] = _control(control, ext[key], f"uniun.{key}")
    return sampling


def _logprobs(body: Mapping[str, Any], *, chat: bool) -> int | None:
    """The job's ``logprobs``: chat ``logprobs: true`` with ``top_logprobs`` 0-20, or the
    legacy completions' ``logprobs`` 0-20 (OpenAI's cap there is 5, vLLM's 20)."""
    asked = body.get("logprobs")
    top = body.get("top_logprobs")
    if not chat:
        if asked is None:
            return None
        if not is_int(asked) or not 0 <= asked <= MAX_TOP_LOGPROBS:
            raise bad_request(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]",
                              "logprobs")
        return int(asked)
    if asked is not None and not isinstance(asked, bool):
        raise bad_request("logprobs must be a boolean", "logprobs")
    if top is not None:
        if not is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise bad_request(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]",
                              "top_logprobs")
        if not asked:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    return (int(top) if top is not None else 0) if asked else None


def _max_tokens(body: Mapping[str, Any], default: int) -> int:
    value = body.get("max_completion_tokens")
    name = "max_completion_tokens"
    if value is None:
        value, name = body.get("max_tokens"), "max_tokens"
    if value is None:
        return default
    if not is_int(value) or value < 1:
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
    if body.get("logit_bias"):
        raise bad_request("logit_bias is not supported", "logit_bias")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad_request("only the text modality is supported", "modalities")
    if body.get("audio"):
        raise bad_request("audio output is not supported", "audio")
    if body.get("reasoning_effort") is not None:  # as OpenAI's own non-reasoning models
        raise bad_request("reasoning_effort is not supported: the model does not reason "
                          "before it answers", "reasoning_effort")
    if body.get("verbosity") not in (None, "medium"):
        raise bad_request("verbosity other than medium is not supported", "verbosity")
    if body.get("web_search_options") is not None:
        raise bad_request("web search is not supported", "web_search_options")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise bad_request("only best_of=1 is supported", "best_of")
    if body.get("echo"):
        raise bad_request("echo is not supported", "echo")
    if body.get("suffix"):
        raise bad_request("suffix is not supported", "suffix")
    refused = sorted(k for k in body if k in REFUSED_EXTENSIONS and body[k] is not None)
    if refused:
        raise bad_request(f"{refused[0]} is not supported by this server (docs/http.md)",
                          refused[0])


def _n(body: Mapping[str, Any]) -> int:
    n = body.get("n")
    if n is None:
        return 1
    if not is_int(n) or not 1 <= n <= MAX_N:
        raise bad_request(f"n must be an integer in [1, {MAX_N}]", "n")
    return int(n)


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
        if not is_number(ext["deadline_in_s"]) or ext["deadline_in_s"] < 0:
            raise bad_request("uniun.deadline_in_s must be a number >= 0", "uniun.deadline_in_s")
        job["deadline"] = now + float(ext["deadline_in_s"])
    return job


def _common(body: Mapping[str, Any], *, default_max_tokens: int, now: float
            ) -> tuple[dict[str, Any], str, bool, bool]:
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
    logprobs = _logprobs(body, chat=True)
    if logprobs is not None:
        job["logprobs"] = logprobs
    tools = tool_fields(body)
    job.update(tools)
    return JobRequest(job, model, stream, usage, f"chatcmpl-{job['job_id']}", n=_n(body),
                      logprobs=logprobs,
                      tools=bool(tools) and tools.get("tool_choice") != "none")


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
    logprobs = _logprobs(body, chat=False)
    if logprobs is not None:
        job["logprobs"] = logprobs
    return JobRequest(job, model, stream, usage, f"cmpl-{job['job_id']}", n=_n(body),
                      logprobs=logprobs)


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
