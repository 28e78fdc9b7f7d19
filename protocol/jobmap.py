"""The job map of ``submit`` (docs/protocol.md, "The job map"), validated into a ``JobSpec``.

Validation happens once, at the edge, before any state changes: everything downstream
(policy, journal, runner) can trust a ``JobSpec``. Every rejection names the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from uniun.protocol.errors import InvalidField
from uniun.protocol.jobmap_sampling import Sampling, parse_sampling
from uniun.protocol.sampling_fields import is_int, is_number
from uniun.protocol.tools import ToolSpec, canonical, parse_tool_choice, parse_tools

DEFAULT_KINDS: tuple[str, ...] = ("chat", "extract", "nataraj", "gana")
DEFAULT_MAX_NEW_TOKENS = 128
MAX_JOB_ID_CHARS = 128
MAX_MESSAGES = 256
ROLES = ("system", "user", "assistant", "tool")
MAX_TOP_LOGPROBS = 20  # as OpenAI's top_logprobs
MAX_CALLS_PER_MESSAGE = 16

_KNOWN_KEYS = frozenset({
    "job_id", "kind", "model_id", "messages", "prompt", "max_new_tokens", "deadline",
    "foreground_hint", "flow", "stream", "sampling",
    # extensions (docs/protocol.md): optional, a v1 peer may omit them
    "stop", "format", "logprobs", "tools", "tool_choice", "cache_prompt", "client",
})
MAX_STOP_STRINGS = 4  # as OpenAI's ``stop``
MAX_STOP_CHARS = 256
FORMAT_TYPES = ("json_object", "json_schema")
MAX_SCHEMA_CHARS = 65_536  # a schema's JSON text
# The model store's name format (models/store.py checks the same pattern): an id that
# cannot be a folder name there is a malformed field, not an unknown model. fullmatch:
# ``$`` would let a trailing newline through.
MODEL_ID_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
MODEL_ID_RULE = "use 1-64 characters a-z 0-9 . _ - starting with a letter or digit"
MAX_SHOWN_KEY = 64  # an unknown key named in an error, characters (the reply must fit)


@dataclass(frozen=True)
class JobFormat:
    """What the output must be (extension ``format``): ``json_object`` or ``json_schema``.

    The schema is kept as canonical JSON text so a spec stays hashable and two equal
    schemas compare equal (idempotent re-submits).
    """

    type: str
    schema_json: str | None = None

    def to_map(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.schema_json is not None:
            out["schema"] = json.loads(self.schema_json)
        return out


@dataclass(frozen=True)
class JobSpec:
    """A valid job, as the client asked for it (defaults filled in)."""

    job_id: str
    kind: str
    model_id: str
    # (role, content) pairs; a message with tool calls or a tool result has a third
    # element, the canonical JSON of its extra keys (tool_calls / tool_call_id, name)
    messages: tuple[tuple[str, ...], ...] | None = None
    prompt: str | None = None
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    deadline: float | None = None
    foreground_hint: bool = False
    flow: str = ""
    stream: bool = True
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple[str, ...] = ()  # extension: the text ends before the first of these
    format: JobFormat | None = None  # extension: constrained output (docs/protocol.md)
    logprobs: int | None = None  # extension: per-token log-probabilities and this many
    # alternatives (0-20); None = none
    tools: ToolSpec | None = None  # extension: functions the model may call
    cache_prompt: bool = False  # extension: keep the whole prompt's KV for siblings
    client: str = ""  # extension: the end client a producer submits for (chat fair shares)

    def to_map(self) -> dict[str, Any]:
        """Back to a wire job map (used by the journal and for idempotency checks)."""
        out: dict[str, Any] = {
            "job_id": self.job_id, "kind": self.kind, "model_id": self.model_id,
            "max_new_tokens": self.max_new_tokens, "deadline": self.deadline,
            "foreground_hint": self.foreground_hint, "flow": self.flow,
            "stream": self.stream, "sampling": self.sampling.to_map(),
        }
        if self.messages is not None:
            out["messages"] = [message_map(m) for m in self.messages]
        else:
            out["prompt"] = self.prompt
        if self.stop:
            out["stop"] = list(self.stop)
        if self.format is not None:
            out["format"] = self.format.to_map()
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        if self.tools is not None:
            out["tools"] = self.tools.tools
            out["tool_choice"] = self.tools.choice_map()
        if self.cache_prompt:
            out["cache_prompt"] = True
        if self.client:
            out["client"] = self.client
        return out


def message_map(message: tuple[str, ...]) -> dict[str, Any]:
    """One ``JobSpec.messages`` entry as the wire map it came from."""
    out: dict[str, Any] = {"role": message[0], "content": message[1]}
    if len(message) > 2:
        out.update(json.loads(message[2]))
    return out


def shown_key(key: Any) -> str:
    """An unknown key as an error names it: bounded, since the key is the client's and
    a reply that echoed a 1 MiB key whole would not fit in a frame."""
    text = str(key)
    return text if len(text) <= MAX_SHOWN_KEY else text[:MAX_SHOWN_KEY] + "..."


def check_model_id_format(model_id: str) -> str:
    """``model_id`` if it has the store's name format, else ``invalid_field model_id``."""
    if not MODEL_ID_RE.fullmatch(model_id):
        raise InvalidField("model_id", f"{model_id[:80]!r} is not a model name: {MODEL_ID_RULE}")
    return model_id


def _check_str(raw: Mapping[str, Any], key: str, *, max_chars: int) -> str:
    value = raw[key]
    if not isinstance(value, str) or not value:
        raise InvalidField(key, "must be a non-empty string")
    if len(value) > max_chars:
        raise InvalidField(key, f"must be at most {max_chars} characters")
    return value


def _parse_calls(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value or len(value) > MAX_CALLS_PER_MESSAGE:
        raise InvalidField(where, f"must be a list of 1-{MAX_CALLS_PER_MESSAGE} "
                                  "{id, name, arguments} maps")
    calls = []
    for j, call in enumerate(value):
        if not isinstance(call, dict) or set(call) - {"id", "name", "arguments"}:
            raise InvalidField(f"{where}[{j}]", "must be a map with id, name, arguments")
        name, arguments, call_id = call.get("name"), call.get("arguments", {}), call.get("id")
        if not isinstance(name, str) or not 0 < len(name) <= 64:
            raise InvalidField(f"{where}[{j}].name", "must be a string of 1-64 characters")
        if not isinstance(arguments, dict):
            raise InvalidField(f"{where}[{j}].arguments", "must be a map")
        if call_id is not None and (not isinstance(call_id, str) or len(call_id) > 128):
            raise InvalidField(f"{where}[{j}].id", "must be a string of at most 128 characters")
        calls.append({k: v for k, v in (("id", call_id), ("name", name),
                                        ("arguments", arguments)) if v is not None})
    return calls


def _parse_message(i: int, item: Any) -> tuple[str, ...]:
    if not isinstance(item, dict):
        raise InvalidField(f"messages[{i}]", "must be a map with role and content")
    role, content = item.get("role"), item.get("content")
    if role not in ROLES:
        raise InvalidField(f"messages[{i}].role", f"must be one of {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise InvalidField(f"messages[{i}].content", "must be a string")
    allowed = {"role", "content"} | ({"tool_calls"} if role == "assistant" else set()) | (
        {"tool_call_id", "name"} if role == "tool" else set())
    unknown = set(item) - allowed
    if unknown:
        raise InvalidField(f"messages[{i}].{shown_key(min(map(str, unknown)))}",
                           f"unknown key for a {role} message")
    extra: dict[str, Any] = {}
    if item.get("tool_calls") is not None:
        extra["tool_calls"] = _parse_calls(item["tool_calls"], f"messages[{i}].tool_calls")
    for key in ("tool_call_id", "name"):
        if item.get(key) is not None:
            if not isinstance(item[key], str) or not 0 < len(item[key]) <= 128:
                raise InvalidField(f"messages[{i}].{key}", "must be a string of 1-128 "
                                                           "characters")
            extra[key] = item[key]
    if not extra:
        return (role, content)
    try:
        return (role, content, canonical(extra))
    except (TypeError, ValueError) as err:
        raise InvalidField(f"messages[{i}].tool_calls", f"not JSON: {err}") from None


def _parse_messages(value: Any) -> tuple[tuple[str, ...], ...]:
    if not isinstance(value, list) or not value:
        raise InvalidField("messages", "must be a non-empty list of {role, content} maps")
    if len(value) > MAX_MESSAGES:
        raise InvalidField("messages", f"at most {MAX_MESSAGES} messages")
    return tuple(_parse_message(i, item) for i, item in enumerate(value))


def _parse_tools(raw: Mapping[str, Any]) -> ToolSpec | None:
    """``tools`` and ``tool_choice``; a choice without tools is refused (it would do
    nothing a client could see)."""
    if raw.get("tools") is None:
        if raw.get("tool_choice") is not None:
            raise InvalidField("tool_choice", "only with tools")
        return None
    tools = parse_tools(raw["tools"])
    choice, name = parse_tool_choice(raw.get("tool_choice"), {t["name"] for t in tools})
    return ToolSpec(canonical(tools, sort_keys=False), choice, name)


def _parse_logprobs(value: Any) -> int | None:
    if value is None:
        return None
    if not is_int(value) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise InvalidField("logprobs", f"must be an integer in [0, {MAX_TOP_LOGPROBS}] (the "
                                       "alternatives per token) or nil")
    return int(value)


def _parse_stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or len(value) > MAX_STOP_STRINGS:
        raise InvalidField("stop", f"must be a string or a list of at most "
                                   f"{MAX_STOP_STRINGS} strings")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not 0 < len(item) <= MAX_STOP_CHARS:
            raise InvalidField(f"stop[{i}]", f"must be a string of 1-{MAX_STOP_CHARS} characters")
    return tuple(value)


def _parse_format(value: Any) -> JobFormat | None:
    """The shape of ``format``; whether a schema compiles is the caller's check
    (``JobRules.check_format``: the protocol room knows no grammar engine)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidField("format", "must be a map with type json_object or json_schema")
    unknown = set(value) - {"type", "schema"}
    if unknown:
        raise InvalidField(f"format.{shown_key(sorted(map(str, unknown))[0])}",
                           "unknown format key")
    kind = value.get("type")
    if kind not in FORMAT_TYPES:
        raise InvalidField("format.type", f"must be one of {', '.join(FORMAT_TYPES)}")
    if kind == "json_object":
        if value.get("schema") is not None:
            raise InvalidField("format.schema", "only with type json_schema")
        return JobFormat(kind)
    schema = value.get("schema")
    if not isinstance(schema, dict):
        raise InvalidField("format.schema", "must be a JSON Schema map")
    try:
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as err:
        raise InvalidField("format.schema", f"not JSON: {err}") from None
    if len(text) > MAX_SCHEMA_CHARS:
        raise InvalidField("format.schema", f"longer than {MAX_SCHEMA_CHARS} characters")
    return JobFormat(kind, text)


def validate_job(raw: Any, *, default_model: str, kinds: tuple[str, ...] = DEFAULT_KINDS,
                 max_new_tokens_cap: int = 4096, max_prompt_chars: int = 200_000) -> JobSpec:
    """Check a wire job map and return the ``JobSpec`` it describes.

    Raises :class:`InvalidField` naming the first offending field. Unknown keys are
    rejected too, so that a misspelt ``dead_line`` does not silently do nothing.
    """
    if not isinstance(raw, dict):
        raise InvalidField("job", "must be a map")
    unknown = [k for k in raw if k not in _KNOWN_KEYS]
    if unknown:
        raise InvalidField(shown_key(unknown[0]), "unknown job field")
    for key in ("job_id", "kind"):
        if key not in raw:
            raise InvalidField(key, "is required")
    job_id = _check_str(raw, "job_id", max_chars=MAX_JOB_ID_CHARS)
    try:
        kind = _check_str(raw, "kind", max_chars=64)
        if kind not in kinds:
            raise InvalidField("kind", f"must be one of {', '.join(kinds)}")
        model_id = default_model
        if raw.get("model_id") is not None:
            model_id = check_model_id_format(_check_str(raw, "model_id", max_chars=128))
        has_messages, has_prompt = raw.get("messages") is not None, raw.get("prompt") is not None
        if has_messages == has_prompt:
            raise InvalidField("messages" if has_messages else "prompt",
                               "give exactly one of messages or prompt")
        messages = _parse_messages(raw["messages"]) if has_messages else None
        prompt = None
        if has_prompt:
            prompt = raw["prompt"]
            if not isinstance(prompt, str) or not prompt:  # the runner has nothing to
                raise InvalidField("prompt", "must be a non-empty string")  # run on ""
        text_len = len(prompt or "") + sum(sum(map(len, m[1:])) for m in messages or ())
        if text_len > max_prompt_chars:
            raise InvalidField("messages" if messages else "prompt",
                               f"input is longer than {max_prompt_chars} characters")
        max_new = raw.get("max_new_tokens")
        if max_new is None:  # the default never exceeds the configured cap
            max_new = min(DEFAULT_MAX_NEW_TOKENS, max_new_tokens_cap)
        if not is_int(max_new) or max_new < 1:
            raise InvalidField("max_new_tokens", "must be an integer >= 1")
        if max_new > max_new_tokens_cap:
            raise InvalidField("max_new_tokens", f"must be at most {max_new_tokens_cap}")
        deadline = raw.get("deadline")
        if deadline is not None and (not is_number(deadline) or deadline < 0):
            raise InvalidField("deadline", "must be unix seconds (a number >= 0) or nil")
        hint = raw.get("foreground_hint", False)
        if not isinstance(hint, bool):
            raise InvalidField("foreground_hint", "must be a boolean")
        flow = kind
        if raw.get("flow") is not None:
            flow = _check_str(raw, "flow", max_chars=128)
        stream = raw.get("stream", True)
        if not isinstance(stream, bool):
            raise InvalidField("stream", "must be a boolean")
        sampling = parse_sampling(raw.get("sampling"))
        stop = _parse_stop(raw.get("stop"))
        fmt = _parse_format(raw.get("format"))
        logprobs = _parse_logprobs(raw.get("logprobs"))
        tools = _parse_tools(raw)
        cache_prompt = raw.get("cache_prompt", False)
        if not isinstance(cache_prompt, bool):
            raise InvalidField("cache_prompt", "must be a boolean")
        client = ""
        if raw.get("client") is not None:
            client = _check_str(raw, "client", max_chars=128)
    except InvalidField as err:
        err.job_id = job_id
        raise
    return JobSpec(job_id=job_id, kind=kind, model_id=model_id, messages=messages,
                   prompt=prompt, max_new_tokens=int(max_new),
                   deadline=None if deadline is None else float(deadline),
                   foreground_hint=hint, flow=flow, stream=stream, sampling=sampling,
                   stop=stop, format=fmt, logprobs=logprobs, tools=tools,
                   cache_prompt=cache_prompt, client=client)
