"""Error codes of protocol v1 and the exception that carries one inside a process.

Errors are values on the wire (an ``error`` message with a ``code``) and exceptions
inside a process: code that finds bad input raises :class:`ProtocolError` (or
:class:`InvalidField`), and the socket adapter turns it into the wire map with
:meth:`ProtocolError.to_body`.
"""

from __future__ import annotations

from enum import Enum
from typing import Any


class ErrorCode(str, Enum):
    """Every error code of protocol v1 (docs/protocol.md). The values are the wire strings."""

    BAD_ENVELOPE = "bad_envelope"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNKNOWN_TYPE = "unknown_type"
    INVALID_FIELD = "invalid_field"
    UNKNOWN_MODEL = "unknown_model"
    QUEUE_FULL = "queue_full"
    NOT_FOUND = "not_found"
    CANCELLED = "cancelled"
    RUNNER_FAILED = "runner_failed"
    SHUTTING_DOWN = "shutting_down"
    INTERNAL = "internal"
    # Extension of v1 (docs/protocol.md): a job that was running at three consecutive
    # runner deaths is dead-lettered instead of crashing the next runner too.
    POISONED = "poisoned"


# Whether a client may sensibly send the same thing again later, by code.
_RETRYABLE = {
    ErrorCode.QUEUE_FULL: True,
    ErrorCode.RUNNER_FAILED: True,
    ErrorCode.SHUTTING_DOWN: True,
}


class ProtocolError(Exception):
    """A request that cannot be served, with the wire code that says why."""

    def __init__(self, code: ErrorCode, message: str, *, field: str | None = None,
                 job_id: str | None = None, retryable: bool | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message
        self.field = field
        self.job_id = job_id
        self.retryable = _RETRYABLE.get(self.code, False) if retryable is None else retryable
        # Extension of v1: when a retry has a chance (a refusal for load, not for content).
        self.retry_after_s = retry_after_s

    def to_body(self) -> dict[str, Any]:
        """The fields of the wire ``error`` message (without the envelope keys)."""
        body: dict[str, Any] = {
            "code": self.code.value,
            "message": self.message,
            "retryable": self.retryable,
        }
        if self.field is not None:
            body["field"] = self.field
        if self.job_id is not None:
            body["job_id"] = self.job_id
        if self.retry_after_s is not None:
            body["retry_after_s"] = self.retry_after_s
        return body

    def __repr__(self) -> str:
        extra = f", field={self.field!r}" if self.field else ""
        return f"{type(self).__name__}({self.code.value!r}, {self.message!r}{extra})"


class InvalidField(ProtocolError):
    """A field of a message or job map is missing, of the wrong type or out of range."""

    def __init__(self, field: str, message: str, *, job_id: str | None = None) -> None:
        super().__init__(ErrorCode.INVALID_FIELD, f"{field}: {message}", field=field,
                         job_id=job_id)
