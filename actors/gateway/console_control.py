"""The console's controls as checked requests: what a button may ask of the scheduler.

Pure (no I/O): each function turns a request body into the protocol request's arguments
or raises a 400 :class:`~uniun.actors.gateway.errors.ApiError` naming the field, so a
bad click changes nothing. The calls themselves go through the gateway's link
(``console_routes``): ``submit`` of a background job, ``cancel``, ``foreground`` and
``lifecycle``, the requests the CLI's ``submit``, ``cancel`` and ``control`` send.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from uniun.actors.gateway.errors import ApiError, bad_request, from_protocol

__all__ = ["DEFAULT_TOKENS", "LIFECYCLES", "PROMPT_MAX_CHARS", "background_job",
           "foreground_kind", "job_id_of", "lifecycle_state", "refused"]

PROMPT_MAX_CHARS = 20_000  # a background job's prompt typed in the page, characters
DEFAULT_TOKENS = 256  # max_new_tokens of a background job that names none
LIFECYCLES = ("foreground", "background")
JOB_ID_MAX = 200  # characters of a job id the page may name (the protocol's own cap)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


def background_job(body: Any, kinds: Sequence[str], max_tokens_cap: int,
                   chat_kind: str = "chat") -> dict[str, Any]:
    """The job map of a background job of ``body["kind"]`` (any configured kind but the
    chat's: a chat is typed in the chat panel), with a fresh ``console-`` job id."""
    body = _object(body)
    kind = body.get("kind")
    allowed = [k for k in kinds if k != chat_kind]
    if not isinstance(kind, str) or kind not in allowed:
        raise bad_request(f"kind must be one of {', '.join(allowed)}", "kind")
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise bad_request("prompt must be a non-empty string", "prompt")
    if len(prompt) > PROMPT_MAX_CHARS:
        raise bad_request(f"prompt is longer than {PROMPT_MAX_CHARS} characters", "prompt")
    tokens = body.get("max_new_tokens", DEFAULT_TOKENS)
    if isinstance(tokens, bool) or not isinstance(tokens, int) \
            or not 1 <= tokens <= max_tokens_cap:
        raise bad_request(f"max_new_tokens must be an integer from 1 to {max_tokens_cap}",
                          "max_new_tokens")
    job: dict[str, Any] = {"job_id": f"console-{kind}-{secrets.token_hex(4)}", "kind": kind,
                           "prompt": prompt, "max_new_tokens": tokens}
    model = body.get("model_id")
    if model is not None:
        if not isinstance(model, str) or not model:
            raise bad_request("model_id must be a model id", "model_id")
        job["model_id"] = model
    unknown = sorted(set(body) - {"kind", "prompt", "max_new_tokens", "model_id"})
    if unknown:
        raise bad_request(f"unknown field {unknown[0]!r}", unknown[0])
    return job


def job_id_of(body: Any) -> str:
    job_id = _object(body).get("job_id")
    if not isinstance(job_id, str) or not job_id or len(job_id) > JOB_ID_MAX:
        raise bad_request("job_id must be a job id", "job_id")
    return job_id


def foreground_kind(body: Any, kinds: Sequence[str]) -> str | None:
    """The kind the user looks at (None: none)."""
    kind = _object(body).get("kind")
    if kind is not None and (not isinstance(kind, str) or kind not in kinds):
        raise bad_request(f"kind must be null or one of {', '.join(kinds)}", "kind")
    return kind


def lifecycle_state(body: Any) -> str:
    state = _object(body).get("state")
    if state not in LIFECYCLES:
        raise bad_request("state must be foreground or background", "state")
    return str(state)


def refused(err: Exception) -> ApiError:
    """A protocol refusal (``ClientError``) of a control request as the page's error."""
    code = getattr(err, "code", "internal")
    return from_protocol(str(code), str(getattr(err, "message", err)),
                         getattr(err, "field", None))
