"""OpenAI's error object and status codes, and how protocol v1 codes map onto them.

An OpenAI client reads ``{"error": {"message", "type", "param", "code"}}`` with an HTTP
status; the SDKs raise ``BadRequestError`` (400), ``AuthenticationError`` (401),
``NotFoundError`` (404), ``RateLimitError`` (429, honouring ``Retry-After``) and
``InternalServerError`` (5xx) from them. Every refusal of the gateway is an
:class:`ApiError`, raised by the door (``door.py``), the body parser (``body.py``), the
request mapping (bad fields) or made from a scheduler's or embedding pool's ``error``
(:func:`from_protocol`). Pure: no I/O.

Nothing internal reaches a client: a message is cut to :data:`MAX_MESSAGE_CHARS` and
written with escapes for what UTF-8 cannot carry, and the message of a code that
reports our side (``internal``, ``runner_failed``, ``shutting_down``, ``poisoned``) is
replaced by a fixed text, since it may hold exception text, paths or endpoints (the log
keeps it).

``poisoned`` (a request a runtime process died of, repeatedly) is a 422: a client error
that the SDKs do not retry. Not a 5xx or a 503, which they retry by themselves, and
each retry of this request would cost the runtime another crash.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["STATUS_OF_CODE", "ApiError", "from_protocol"]

RETRY_AFTER_S = 1  # Retry-After on a 429 / 503, seconds
MAX_MESSAGE_CHARS = 400  # an error message is cut to this (it may echo a client's value)

# protocol v1 code -> (HTTP status, OpenAI error type)
STATUS_OF_CODE: dict[str, tuple[int, str]] = {
    "invalid_field": (400, "invalid_request_error"),
    "bad_envelope": (400, "invalid_request_error"),
    "unknown_model": (404, "invalid_request_error"),
    "not_found": (404, "invalid_request_error"),
    "queue_full": (429, "rate_limit_error"),
    "shutting_down": (503, "server_error"),
    "runner_failed": (503, "server_error"),
    "cancelled": (499, "invalid_request_error"),
    "poisoned": (422, "invalid_request_error"),
    "internal": (500, "server_error"),
}
# What a client is told for a code that reports our side, whatever the message said.
FIXED_MESSAGES = {
    "internal": "an internal error of the runtime; see its log",
    "runner_failed": "the model runner could not finish this request; retry",
    "shutting_down": "the runtime is shutting down or not reachable; retry",
    "poisoned": "a runtime process died each time it handled this request, so it is "
                "refused; do not send it again (the runtime's log has the details)",
}


@dataclass
class ApiError(Exception):
    """A refusal as OpenAI shapes it. ``code`` is the protocol's code where there is one."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    retry_after_s: float | None = None  # the runtime's hint, where it gave one

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": _printable(self.message, MAX_MESSAGE_CHARS),
                          "type": self.type,
                          "param": None if self.param is None else _printable(self.param, 200),
                          "code": self.code}}

    def headers(self) -> dict[str, str]:
        """``Retry-After`` on what a client should retry (429, 503): the runtime's hint
        rounded up to whole seconds (the header's unit), else ``RETRY_AFTER_S``."""
        if self.status not in (429, 503):
            return {}
        wait = RETRY_AFTER_S if self.retry_after_s is None else math.ceil(self.retry_after_s)
        return {"Retry-After": str(max(1, wait))}


def bad_request(message: str, param: str | None = None, code: str = "invalid_field") -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


def _printable(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, lone surrogates written as escapes."""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def from_protocol(code: str, message: str, field: str | None = None, *,
                  retry_after_s: float | None = None) -> ApiError:
    """An ``error`` reply or event of protocol v1 as the HTTP error a client expects."""
    if code not in STATUS_OF_CODE:
        code = "internal"
    status, kind = STATUS_OF_CODE[code]
    if code == "unknown_model":
        return ApiError(404, message, kind, "model", "model_not_found")
    return ApiError(status, FIXED_MESSAGES.get(code, message), kind, _openai_param(field),
                    code, retry_after_s)


def _openai_param(field: str | None) -> str | None:
    """The job-map field named back as the request parameter that set it."""
    if field is None:
        return None
    top = field.split(".")[0].split("[")[0]
    return {"max_new_tokens": "max_tokens", "model_id": "model", "format": "response_format",
            "sampling": field.split(".")[-1]}.get(top, field)
