"""Protocol v1 messages: the type names, validation of requests, builders for the rest.

Theory of operation (h11-style: no I/O here, any socket layer drives it):

- A server (the scheduler's front actor, the embedding pool) turns a frame into a typed,
  valid request with :func:`parse_frame` (= :func:`uniun.protocol.codec.decode` +
  :func:`parse_request`). Anything wrong raises :class:`ProtocolError` carrying the
  PROTOCOL.md code; the server answers it with ``reply_error(reply_to(msg), err)`` and
  carries on. Nothing is changed before validation has passed.
- Envelope checks come first, in this order: ``v`` (an int; ``1`` else
  ``unsupported_version``), ``type`` (a str; known else ``unknown_type``), ``id`` (a
  1-128 char str), then the body of that type. A missing or mistyped envelope key is
  ``invalid_field`` naming it. Unknown *extra* keys are ignored, because PROTOCOL.md lets
  the project add optional fields; the job map is stricter (see ``jobmap.py``).
- Servers build every outgoing map with the ``reply_*`` and ``event_*`` builders, which
  check their own arguments (a bad pause reason is a bug of ours: ``ValueError``), so
  that no process hand-builds wire maps. Clients build requests with ``req_*``.
- A server message with ``re`` is a reply; one with ``job_id`` and no ``re`` is a job
  event (:func:`classify`). ``status`` and ``error`` are both request/reply or
  reply/event names, so the ``re`` key is what tells them apart.

Extension over PROTOCOL.md v1 (optional, so compatible): ``attach`` may carry
``after_seq`` (int >= -1, default -1): the client already holds tokens up to that
``seq``; a scheduler that still has later tokens may send them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Literal, Mapping, Union

from uniun.protocol.codec import DEFAULT_LIMITS, Limits, decode
from uniun.protocol.errors import ErrorCode, InvalidField, ProtocolError
from uniun.protocol.jobmap import DEFAULT_KINDS, JobSpec, validate_job

PROTOCOL_VERSION = 1
MAX_ID_CHARS = 128  # message ids and job ids, characters

# Client -> scheduler requests.
SUBMIT = "submit"
CANCEL = "cancel"
ATTACH = "attach"
FOREGROUND = "foreground"
LIFECYCLE = "lifecycle"
STATUS = "status"
PING = "ping"
FRONT_REQUESTS: frozenset[str] = frozenset(
    {SUBMIT, CANCEL, ATTACH, FOREGROUND, LIFECYCLE, STATUS, PING})

# Client -> embedding pool request, and its reply.
EMBED = "embed"
EMBEDDINGS = "embeddings"
EMBED_REQUESTS: frozenset[str] = frozenset({EMBED, PING})
MAX_EMBED_TEXTS = 256  # texts in one embed request

# Scheduler -> client replies (``re`` set). ``status`` is also the request name.
ACCEPTED = "accepted"
CANCELLED = "cancelled"
OK = "ok"
PONG = "pong"
ERROR = "error"
REPLY_TYPES: frozenset[str] = frozenset({ACCEPTED, CANCELLED, OK, PONG, STATUS, ERROR, EMBEDDINGS})

# Scheduler -> client job events (``job_id`` set, no ``re``). ``error`` is also a reply.
STARTED = "started"
TOKEN = "token"
PAUSED = "paused"
DONE = "done"
EVENT_TYPES: frozenset[str] = frozenset({STARTED, TOKEN, PAUSED, DONE, ERROR})
TERMINAL_EVENTS: frozenset[str] = frozenset({DONE, ERROR})

PAUSE_REASONS = ("preempted", "slice", "budget", "swap")
FINISH_REASONS = ("stop", "length")
LIFECYCLE_STATES = ("foreground", "background")


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
    state: str  # "foreground" or "background"


@dataclass(frozen=True)
class StatusRequest:
    id: str


@dataclass(frozen=True)
class Ping:
    id: str


@dataclass(frozen=True)
class Embed:
    id: str
    texts: tuple[str, ...]


Request = Union[Submit, Cancel, Attach, Foreground, Lifecycle, StatusRequest, Ping, Embed]


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
    known_models: Collection[str] | None = field(default=None)


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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
        if state not in LIFECYCLE_STATES:
            raise InvalidField("state", f"must be one of {', '.join(LIFECYCLE_STATES)}")
        return Lifecycle(mid, state)
    if mtype == STATUS:
        return StatusRequest(mid)
    if mtype == PING:
        return Ping(mid)
    if mtype == EMBED:
        return Embed(mid, _parse_texts(msg.get("texts")))
    # check_envelope only lets through types in ``allowed``; a type allowed but not
    # handled above is a bug of the caller's ``allowed`` set.
    raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"no parser for message type {mtype!r}",
                        field="type")


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


def classify(msg: Mapping[str, Any]) -> Literal["reply", "event"]:
    """Tell a server message's kind, checking the keys a client routes by.

    Raises ``ProtocolError(bad_envelope)`` for a message a client cannot route.
    """
    if msg.get("v") != PROTOCOL_VERSION or not isinstance(msg.get("type"), str):
        raise ProtocolError(ErrorCode.BAD_ENVELOPE, "server message without v=1 and a type")
    if isinstance(msg.get("re"), str):
        return "reply"
    if msg["type"] in EVENT_TYPES and isinstance(msg.get("job_id"), str):
        if msg["type"] == TOKEN and not (_is_int(msg.get("seq")) and isinstance(msg.get("text"), str)):
            raise ProtocolError(ErrorCode.BAD_ENVELOPE, "token event without int seq and str text")
        return "event"
    raise ProtocolError(ErrorCode.BAD_ENVELOPE, "server message is neither a reply nor a job event")


# --- builders --------------------------------------------------------------------

def envelope(mtype: str, **fields: Any) -> dict[str, Any]:
    """A message map: ``{"v": 1, "type": mtype, **fields}``, ``None`` fields kept."""
    return {"v": PROTOCOL_VERSION, "type": mtype, **fields}


def _reply(mtype: str, re: str | None, **fields: Any) -> dict[str, Any]:
    msg = envelope(mtype, **fields)
    if re is not None:
        msg["re"] = re
    return msg


def req_submit(msg_id: str, job: Mapping[str, Any]) -> dict[str, Any]:
    return envelope(SUBMIT, id=msg_id, job=dict(job))


def req_cancel(msg_id: str, job_id: str) -> dict[str, Any]:
    return envelope(CANCEL, id=msg_id, job_id=job_id)


def req_attach(msg_id: str, job_id: str, after_seq: int = -1) -> dict[str, Any]:
    return envelope(ATTACH, id=msg_id, job_id=job_id, after_seq=after_seq)


def req_foreground(msg_id: str, kind: str | None) -> dict[str, Any]:
    return envelope(FOREGROUND, id=msg_id, kind=kind)


def req_lifecycle(msg_id: str, state: str) -> dict[str, Any]:
    if state not in LIFECYCLE_STATES:
        raise ValueError(f"lifecycle state must be one of {LIFECYCLE_STATES}, not {state!r}")
    return envelope(LIFECYCLE, id=msg_id, state=state)


def req_status(msg_id: str) -> dict[str, Any]:
    return envelope(STATUS, id=msg_id)


def req_ping(msg_id: str) -> dict[str, Any]:
    return envelope(PING, id=msg_id)


def req_embed(msg_id: str, texts: list[str]) -> dict[str, Any]:
    return envelope(EMBED, id=msg_id, texts=list(texts))


def reply_accepted(re: str, job_id: str, tier: str | int, *, state: str | None = None,
                   **extra: Any) -> dict[str, Any]:
    """``accepted {job_id, tier}``; an ``attach`` reply adds the job's ``state``."""
    if state is not None:
        extra["state"] = state
    return _reply(ACCEPTED, re, job_id=job_id, tier=tier, **extra)


def reply_cancelled(re: str, job_id: str) -> dict[str, Any]:
    return _reply(CANCELLED, re, job_id=job_id)


def reply_ok(re: str) -> dict[str, Any]:
    return _reply(OK, re)


def reply_pong(re: str) -> dict[str, Any]:
    return _reply(PONG, re)


def reply_status(re: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """``status {...}``: ``body`` holds policy, lifecycle, foreground, queues, ..."""
    clash = {"v", "type", "re", "id"} & set(body)
    if clash:
        raise ValueError(f"status body must not use envelope keys {sorted(clash)}")
    return _reply(STATUS, re, **body)


def reply_embeddings(re: str, dim: int, vectors: list[bytes]) -> dict[str, Any]:
    """``embeddings {dim, vectors}``: float32 little-endian byte strings, one per text."""
    if any(len(v) != 4 * dim for v in vectors):
        raise ValueError(f"every vector must hold {dim} float32 values")
    return _reply(EMBEDDINGS, re, dim=dim, vectors=list(vectors))


def reply_error(re: str | None, err: ProtocolError) -> dict[str, Any]:
    """``error {code, message, field?, job_id?, retryable}``; no ``re`` if unaddressable."""
    return _reply(ERROR, re, **err.to_body())


def event_started(job_id: str, model_id: str, resumed: bool, tier: str | int) -> dict[str, Any]:
    return envelope(STARTED, job_id=job_id, model_id=model_id, resumed=bool(resumed), tier=tier)


def event_token(job_id: str, seq: int, text: str) -> dict[str, Any]:
    if not _is_int(seq) or seq < 0:
        raise ValueError(f"token seq must be an int >= 0, not {seq!r}")
    return envelope(TOKEN, job_id=job_id, seq=seq, text=text)


def event_paused(job_id: str, reason: str) -> dict[str, Any]:
    if reason not in PAUSE_REASONS:
        raise ValueError(f"pause reason must be one of {PAUSE_REASONS}, not {reason!r}")
    return envelope(PAUSED, job_id=job_id, reason=reason)


def event_done(job_id: str, *, text: str, finish_reason: str, prompt_tokens: int,
               completion_tokens: int, queued_s: float, ttft_s: float | None, total_s: float,
               preemptions: int) -> dict[str, Any]:
    """``done``: the whole text, why it stopped, token counts, timings in seconds.

    ``ttft_s`` is None when no token was produced.
    """
    if finish_reason not in FINISH_REASONS:
        raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, not {finish_reason!r}")
    return envelope(
        DONE, job_id=job_id, text=text, finish_reason=finish_reason,
        usage={"prompt_tokens": int(prompt_tokens), "completion_tokens": int(completion_tokens)},
        timings={"queued_s": float(queued_s),
                 "ttft_s": None if ttft_s is None else float(ttft_s),
                 "total_s": float(total_s)},
        preemptions=int(preemptions))


def event_error(job_id: str, code: ErrorCode | str, message: str, *,
                retryable: bool | None = None) -> dict[str, Any]:
    """A job's terminal ``error {code, message, retryable}`` (e.g. ``runner_failed``)."""
    err = ProtocolError(ErrorCode(code), message, retryable=retryable)
    return envelope(ERROR, job_id=job_id, code=err.code.value, message=message,
                    retryable=err.retryable)
