"""Protocol v1 requests: their typed forms, and the validation that makes them.

Theory of operation (h11-style: no I/O here, any socket layer drives it):

- A server (the scheduler's front actor, the embedding pool) turns a frame into a typed,
  valid request with :func:`parse_frame` (= :func:`uniun.protocol.codec.decode` +
  :func:`parse_request`). Anything wrong raises :class:`ProtocolError` carrying the
  protocol code (docs/protocol.md); the server answers it with
  ``reply_error(reply_to(msg), err)`` and carries on. Nothing is changed before
  validation has passed.
- Envelope checks come first, in this order: ``v`` (an int; ``1`` else
  ``unsupported_version``), ``type`` (a str; known else ``unknown_type``), ``id`` (a
  1-128 char str), then the body of that type. A missing or mistyped envelope key is
  ``invalid_field`` naming it. Unknown *extra* keys are ignored, because the protocol lets
  the project add optional fields; the job map is stricter (see ``jobmap.py``).

Extension over protocol v1 (optional, so compatible): ``attach`` may carry
``after_seq`` (int >= -1, default -1): the client already holds tokens up to that
``seq``; a scheduler that still has later tokens may send them again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Mapping
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from uniun.protocol.codec import DEFAULT_LIMITS, Limits, decode
from uniun.protocol.errors import ErrorCode, InvalidField, ProtocolError
from uniun.protocol.jobmap import DEFAULT_KINDS, JobSpec, validate_job
from uniun.protocol.messages import (
    ATTACH,
    CANCEL,
    EMBED,
    FOREGROUND,
    FRONT_REQUESTS,
    LIFECYCLE,
    LIFECYCLE_STATES,
    MAX_EMBED_TEXTS,
    MAX_ID_CHARS,
    PING,
    PROTOCOL_VERSION,
    STATUS,
    SUBMIT,
    WATCH,
    _is_int,
)
from uniun.protocol.power_state import PowerState, parse_power
from uniun.protocol.schema_bounds import check_schema_bounds

# --- typed requests --------------------------------------------------------------

@dataclass(frozen=True)
class Submit:
    id: str
    job: JobSpec


@dataclass(frozen=True)
class Cancel:
    id: str
    job_id: str


@dataclass(frozen=True)
class Attach:
    id: str
    job_id: str
    after_seq: int = -1  # tokens the client already has, up to and including this seq


@dataclass(frozen=True)
class Foreground:
    id: str
    kind: str | None  # None: no kind is in the foreground


@dataclass(frozen=True)
class Lifecycle:
    id: str
    state: str | None  # "foreground" or "background"; None: unchanged (power facts only)
    power: PowerState | None = None  # the app's device facts (docs/device.md), if sent


@dataclass(frozen=True)
class StatusRequest:
    id: str


@dataclass(frozen=True)
class Ping:
    id: str


@dataclass(frozen=True)
class Watch:
    id: str


@dataclass(frozen=True)
class Embed:
    id: str
    texts: tuple[str, ...]


Request = Submit | Cancel | Attach | Foreground | Lifecycle | StatusRequest | Ping | Embed | Watch


@dataclass(frozen=True)
class JobRules:
    """What the scheduler's configuration allows in a job; passed to ``validate_job``.

    ``known_models``: if given, a job naming a model outside it is ``unknown_model``
    (the protocol room does not know models; the caller passes their ids).
    """

    default_model: str
    kinds: tuple[str, ...] = DEFAULT_KINDS
    max_new_tokens_cap: int = 4096
    max_prompt_chars: int = 200_000
    known_models: Container[str] | None = field(default=None)  # only asked `in`
    # ``check_format(fmt, model_id)`` raises ValueError (its message) for a ``format`` the
    # grammar engine cannot compile for that model; the scheduler passes its grammar
    # sandbox's check (models/grammar_sandbox.py). None: shape and bounds checks only
    # (protocol/schema_bounds.py runs either way).
    check_format: Callable[[dict[str, Any], str], None] | None = field(default=None)


# --- parsing -------------------------------------------------------------------------

def reply_to(msg: Any) -> str | None:
    """The ``id`` to put in a reply's ``re``: the request's id if it is a valid one.

    Works on anything, so a server can address an error even for a broken message.
    """
    if isinstance(msg, dict):
        mid = msg.get("id")
        if isinstance(mid, str) and 0 < len(mid) <= MAX_ID_CHARS:
            return mid
    return None


def _require_id(msg: Mapping[str, Any], key: str) -> str:
    value = msg.get(key)
    if value is None:
        raise InvalidField(key, "is required")
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
        raise InvalidField(key, f"must be a string of 1-{MAX_ID_CHARS} characters")
    return value


def check_envelope(msg: Any, allowed: Collection[str] = FRONT_REQUESTS) -> tuple[str, str]:
    """Check ``v``, ``type`` and ``id`` of a request; return ``(type, id)``."""
    if not isinstance(msg, dict):
        raise ProtocolError(ErrorCode.BAD_ENVELOPE, "message is not a map")
    version = msg.get("v")
    if version is None:
        raise InvalidField("v", "is required (protocol version, 1)")
    if not _is_int(version):
        raise InvalidField("v", "must be an integer")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(ErrorCode.UNSUPPORTED_VERSION,
                            f"protocol version {version} is not supported; this server speaks "
                            f"{PROTOCOL_VERSION}", field="v")
    mtype = msg.get("type")
    if not isinstance(mtype, str):
        raise InvalidField("type", "must be a string")
    if mtype not in allowed:
        shown = mtype if len(mtype) <= 40 else mtype[:40] + "..."
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE,
                            f"unknown message type {shown!r}; expected one of "
                            f"{', '.join(sorted(allowed))}", field="type")
    return mtype, _require_id(msg, "id")


def parse_request(msg: Any, rules: JobRules, *,
                  allowed: Collection[str] = FRONT_REQUESTS) -> Request:
    """Validate a decoded request and return its typed form, or raise ``ProtocolError``.

    ``allowed`` is the set of request types this server answers: ``FRONT_REQUESTS``
    for the scheduler, ``EMBED_REQUESTS`` for the embedding pool.
    """
    mtype, mid = check_envelope(msg, allowed)
    if mtype == SUBMIT:
        job = validate_job(msg.get("job"), default_model=rules.default_model,
                           kinds=rules.kinds, max_new_tokens_cap=rules.max_new_tokens_cap,
                           max_prompt_chars=rules.max_prompt_chars)
        if rules.known_models is not None and job.model_id not in rules.known_models:
            raise ProtocolError(ErrorCode.UNKNOWN_MODEL, f"unknown model {job.model_id!r}",
                                field="model_id", job_id=job.job_id)
        _check_schemas(rules, job)
        return Submit(mid, job)
    if mtype == CANCEL:
        return Cancel(mid, _require_id(msg, "job_id"))
    if mtype == ATTACH:
        after = msg.get("after_seq", -1)
        if after is None:
            after = -1
        if not _is_int(after) or after < -1:
            raise InvalidField("after_seq", "must be an integer >= -1")
        return Attach(mid, _require_id(msg, "job_id"), after)
    if mtype == FOREGROUND:
        if "kind" not in msg:
            raise InvalidField("kind", "is required (a job kind, or nil for none)")
        kind = msg["kind"]
        if kind is not None and (not isinstance(kind, str) or kind not in rules.kinds):
            raise InvalidField("kind", f"must be nil or one of {', '.join(rules.kinds)}")
        return Foreground(mid, kind)
    if mtype == LIFECYCLE:
        state = msg.get("state")
        power = parse_power(msg["power"]) if msg.get("power") is not None else None
        if state not in LIFECYCLE_STATES and not (state is None and power is not None):
            raise InvalidField("state", f"must be one of {', '.join(LIFECYCLE_STATES)} "
                                        "(or left out when power is given)")
        return Lifecycle(mid, state, power)
    if mtype == STATUS:
        return StatusRequest(mid)
    if mtype == PING:
        return Ping(mid)
    if mtype == WATCH:
        return Watch(mid)
    if mtype == EMBED:
        return Embed(mid, _parse_texts(msg.get("texts")))
    # check_envelope only lets through types in ``allowed``; a type allowed but not
    # handled above is a bug of the caller's ``allowed`` set.
    raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"no parser for message type {mtype!r}",
                        field="type")


def _check_schemas(rules: JobRules, job: JobSpec) -> None:
    """``invalid_field`` naming the schema unless each of the job's schemas is within the
    bounds (always: pure Python) and, given a ``check_format``, compiles."""
    if job.format is not None:
        _check_schema(rules, job.format.to_map(), "format.schema", job)
    for i, tool in enumerate(job.tools.tools if job.tools is not None else ()):
        if "parameters" in tool:
            _check_schema(rules, {"type": "json_schema", "schema": tool["parameters"]},
                          f"tools[{i}].parameters", job)
    if rules.check_format is not None and job.tools is not None and job.tools.active:
        fmt = job.tools.to_format()  # the whole grammar, as the runner will build it
        if job.format is not None:  # (calls and text together)
            fmt["format"] = job.format.to_map()
        _check_schema(rules, fmt, "tools", job, bounds=False)


def _check_schema(rules: JobRules, fmt: dict[str, Any], where: str, job: JobSpec, *,
                  bounds: bool = True) -> None:
    """``invalid_field`` naming ``where`` unless ``fmt``'s schema is within the bounds
    (``schema_bounds``: before any native code sees it) and the grammar engine compiles
    ``fmt``."""
    try:
        if bounds:
            check_schema_bounds(fmt.get("schema"))
        if rules.check_format is not None:
            rules.check_format(fmt, job.model_id)
    except ValueError as err:
        raise InvalidField(where, str(err)[:300], job_id=job.job_id) from None
    except Exception as err:  # noqa: BLE001 - a grammar engine's own failure on a
        # hostile schema is still the schema's fault, not ours: invalid_field
        logger.bind(job=job.job_id).warning("compiling {} failed: {!r}", where, err)
        raise InvalidField(where, "cannot be compiled", job_id=job.job_id) from None


def _parse_texts(texts: Any) -> tuple[str, ...]:
    if not isinstance(texts, list) or not texts:
        raise InvalidField("texts", "must be a non-empty list of strings")
    if len(texts) > MAX_EMBED_TEXTS:
        raise InvalidField("texts", f"at most {MAX_EMBED_TEXTS} texts per request")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidField(f"texts[{i}]", "must be a string")
    return tuple(texts)


def parse_frame(frame: bytes, rules: JobRules, *, limits: Limits = DEFAULT_LIMITS,
                allowed: Collection[str] = FRONT_REQUESTS) -> Request:
    """Decode and validate one request frame (raises ``ProtocolError``).

    To address an error reply, decode first and use :func:`reply_to` on the map; a
    frame that does not decode has no id to answer (reply without ``re``).
    """
    return parse_request(decode(frame, limits), rules, allowed=allowed)
