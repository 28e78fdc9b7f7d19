"""Protocol v1 messages: the type names, and the builders of every map a peer sends.

Theory of operation (h11-style: no I/O here, any socket layer drives it):

- Servers build every outgoing map with the ``reply_*`` and ``event_*`` builders, which
  check their own arguments (a bad pause reason is a bug of ours: ``ValueError``), so
  that no process hand-builds wire maps. Clients build requests with ``req_*``.
- A server message with ``re`` is a reply; one with ``job_id`` and no ``re`` is a job
  event (:func:`classify`). ``status`` and ``error`` are both request/reply or
  reply/event names, so the ``re`` key is what tells them apart.
- Incoming requests are validated in :mod:`uniun.protocol.requests`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from uniun.protocol.errors import ErrorCode, ProtocolError

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
WATCH = "watch"  # extension: follow the scheduler's state (``state`` events)
FRONT_REQUESTS: frozenset[str] = frozenset(
    {SUBMIT, CANCEL, ATTACH, FOREGROUND, LIFECYCLE, STATUS, PING, WATCH})

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

# Scheduler -> a watching client (no ``re``, no ``job_id``): extension, docs/protocol.md.
STATE = "state"

# Why a job was paused: a higher tier took the runner, its slice or its token budget was
# spent, or the runner swaps to another model. Named once, for the wire and the policy.
PauseReason = Literal["preempted", "slice", "budget", "swap"]
PAUSE_REASONS: tuple[PauseReason, ...] = get_args(PauseReason)
FINISH_REASONS = ("stop", "length", "tool_calls")  # tool_calls: only for a job with tools
LIFECYCLE_STATES = ("foreground", "background")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def classify(msg: Mapping[str, Any]) -> Literal["reply", "event", "state"]:
    """Tell a server message's kind, checking the keys a client routes by.

    Raises ``ProtocolError(bad_envelope)`` for a message a client cannot route.
    """
    if msg.get("v") != PROTOCOL_VERSION or not isinstance(msg.get("type"), str):
        raise ProtocolError(ErrorCode.BAD_ENVELOPE, "server message without v=1 and a type")
    if isinstance(msg.get("re"), str):
        return "reply"
    if msg["type"] == STATE:
        return "state"
    if msg["type"] in EVENT_TYPES and isinstance(msg.get("job_id"), str):
        if msg["type"] == TOKEN and not (_is_int(msg.get("seq"))
                                         and isinstance(msg.get("text"), str)):
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


def req_lifecycle(msg_id: str, state: str | None,
                  power: dict[str, Any] | None = None) -> dict[str, Any]:
    """``lifecycle``: the app's state, and optionally the device's ``power`` facts
    (``protocol/power_state.py``); at least one of the two."""
    if state is None and power is None:
        raise ValueError("lifecycle needs a state, power facts, or both")
    if state is not None and state not in LIFECYCLE_STATES:
        raise ValueError(f"lifecycle state must be one of {LIFECYCLE_STATES}, not {state!r}")
    fields: dict[str, Any] = {}
    if state is not None:
        fields["state"] = state
    if power is not None:
        fields["power"] = power
    return envelope(LIFECYCLE, id=msg_id, **fields)


def req_status(msg_id: str) -> dict[str, Any]:
    return envelope(STATUS, id=msg_id)


def req_ping(msg_id: str) -> dict[str, Any]:
    return envelope(PING, id=msg_id)


def req_watch(msg_id: str) -> dict[str, Any]:
    return envelope(WATCH, id=msg_id)


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


def expand_logprobs(record: Any) -> dict[str, Any] | None:
    """A ``token`` event's ``logprobs`` from the runner's compact record (``[text, bytes,
    logprob, [[text, bytes, logprob], ...]]``, runner_records ``Token``); None for none or
    a record that is not one (a runner bug must not take the scheduler down)."""
    try:
        text, raw, logprob, top = record
        return {"token": text, "bytes": list(raw), "logprob": logprob,
                "top_logprobs": [{"token": t, "bytes": list(b), "logprob": v}
                                 for t, b, v in top]}
    except (TypeError, ValueError):
        return None


def event_token(job_id: str, seq: int, text: str,
                logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """``token``; ``logprobs`` (extension) only for a job that asked for them."""
    if not _is_int(seq) or seq < 0:
        raise ValueError(f"token seq must be an int >= 0, not {seq!r}")
    if logprobs is not None:
        return envelope(TOKEN, job_id=job_id, seq=seq, text=text, logprobs=logprobs)
    return envelope(TOKEN, job_id=job_id, seq=seq, text=text)


def event_paused(job_id: str, reason: str) -> dict[str, Any]:
    if reason not in PAUSE_REASONS:
        raise ValueError(f"pause reason must be one of {PAUSE_REASONS}, not {reason!r}")
    return envelope(PAUSED, job_id=job_id, reason=reason)


def event_done(job_id: str, *, text: str, finish_reason: str, prompt_tokens: int,
               completion_tokens: int, queued_s: float, ttft_s: float | None, total_s: float,
               preemptions: int, tool_calls: list[dict[str, Any]] | None = None
               ) -> dict[str, Any]:
    """``done``: the whole text, why it stopped, token counts, timings in seconds.

    ``ttft_s`` is None when no token was produced. ``tool_calls`` (extension): the calls
    the text makes, for a job with tools whose answer is a call.
    """
    if finish_reason not in FINISH_REASONS:
        raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, not {finish_reason!r}")
    return envelope(
        DONE, job_id=job_id, text=text, finish_reason=finish_reason,
        usage={"prompt_tokens": int(prompt_tokens), "completion_tokens": int(completion_tokens)},
        timings={"queued_s": float(queued_s),
                 "ttft_s": None if ttft_s is None else float(ttft_s),
                 "total_s": float(total_s)},
        preemptions=int(preemptions), **({"tool_calls": tool_calls} if tool_calls else {}))


def event_error(job_id: str, code: ErrorCode | str, message: str, *,
                retryable: bool | None = None) -> dict[str, Any]:
    """A job's terminal ``error {code, message, retryable}`` (e.g. ``runner_failed``)."""
    err = ProtocolError(ErrorCode(code), message, retryable=retryable)
    return envelope(ERROR, job_id=job_id, code=err.code.value, message=message,
                    retryable=err.retryable)


def event_state(**fields: Any) -> dict[str, Any]:
    """``state {status?, segments?, marks?}`` for a watching client (docs/protocol.md)."""
    return envelope(STATE, **fields)
