"""A job's event stream, and the exceptions the client library raises.

Split from :mod:`uniun.protocol.client` (which re-exports all of it) so each module
keeps one job: this one holds a job's events in order and dedupes tokens by ``seq``;
the client owns the socket and routes events here.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Iterator, Mapping, Protocol

from uniun.protocol import messages as m

__all__ = ["ClientError", "JobFailed", "SchedulerUnavailable", "Timeout", "JobStream",
           "StreamOwner"]


class StreamOwner(Protocol):
    """What a stream needs of the connection that feeds it (the client implements it)."""

    def _wait_until(self, ready: Callable[[], bool], timeout: float | None,
                    what: str) -> None: ...

    def cancel(self, job_id: str) -> Any: ...

    def _release(self, job_id: str) -> None: ...


class ClientError(Exception):
    """The scheduler answered ``error``: ``code`` is the PROTOCOL.md code."""

    def __init__(self, code: str, message: str, *, field: str | None = None,
                 job_id: str | None = None, retryable: bool = False,
                 retry_after_s: float | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.field = code, message, field
        self.job_id, self.retryable = job_id, retryable
        self.retry_after_s = retry_after_s  # a refusal for load says when to try again

    @classmethod
    def from_msg(cls, msg: Mapping[str, Any]) -> "ClientError":
        hint = msg.get("retry_after_s")
        valid = isinstance(hint, (int, float)) and not isinstance(hint, bool) and hint >= 0
        return cls(str(msg.get("code", "internal")), str(msg.get("message", "")),
                   field=msg.get("field"), job_id=msg.get("job_id"),
                   retryable=bool(msg.get("retryable", False)),
                   retry_after_s=float(hint) if valid else None)


class JobFailed(ClientError):
    """A job ended with an ``error`` event (e.g. ``runner_failed``, ``cancelled``)."""


class SchedulerUnavailable(ConnectionError):
    """No scheduler at the endpoint, or it went away and did not come back in time."""


class Timeout(TimeoutError):
    """The scheduler is connected but did not answer in time (the request may still act)."""


class JobStream:
    """The events of one job, in order, ending with ``done`` or ``error``.

    Iterate it for event maps (``{"v", "type", "job_id", ...}`` as on the wire).
    ``accepted`` is the ``accepted`` reply; ``final`` the terminal event once seen;
    ``last_seq`` the last token's ``seq``; ``missed_tokens`` counts tokens that never
    arrived (only possible across a reconnect to a scheduler that could not resend
    them -- ``done.text`` is whole regardless).
    """

    def __init__(self, client: StreamOwner, job_id: str) -> None:
        self.job_id = job_id
        self.accepted: dict[str, Any] | None = None
        self.final: dict[str, Any] | None = None
        self.last_seq = -1
        self.missed_tokens = 0
        self._client = client
        self._queue: deque[dict[str, Any]] = deque()
        self._ended = False  # terminal event seen, cancelled by us, or closed
        self._failure: ClientError | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        event = self.next_event()
        if event is None:
            raise StopIteration
        return event

    def next_event(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next event; ``None`` once the stream has ended. Raises ``Timeout``."""
        def ready() -> bool:
            return bool(self._queue) or self._ended or self._failure is not None

        if not ready():
            self._client._wait_until(ready, timeout, f"events of job {self.job_id}")
        if self._queue:
            return self._queue.popleft()
        if self._failure is not None:
            failure, self._failure = self._failure, None
            self._ended = True
            raise failure
        return None

    def tokens(self) -> Iterator[str]:
        """Just the text of the ``token`` events (the stream is consumed)."""
        for event in self:
            if event["type"] == m.TOKEN:
                yield event["text"]

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        """Consume the stream and return the ``done`` event; raise ``JobFailed`` on error."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (event := self.next_event(
                None if deadline is None else max(0.0, deadline - time.monotonic()))) is not None:
            if event["type"] == m.ERROR:
                raise JobFailed.from_msg(event)
        if self.final is None or self.final["type"] != m.DONE:
            raise JobFailed("cancelled", f"job {self.job_id} ended without done",
                            job_id=self.job_id)
        return self.final

    def cancel(self) -> dict[str, Any]:
        """Cancel this job (see :meth:`Client.cancel`)."""
        return self._client.cancel(self.job_id)

    def close(self) -> None:
        """Stop receiving this job's events (the job itself keeps running)."""
        self._ended = True
        self._client._release(self.job_id)

    # -- called by the client's router -----------------------------------------------

    def _push(self, event: dict[str, Any]) -> None:
        if self.final is not None:
            return
        if event["type"] == m.TOKEN:
            seq = event["seq"]
            if seq <= self.last_seq:
                return  # already delivered before a reconnect
            self.missed_tokens += seq - self.last_seq - 1
            self.last_seq = seq
        if event["type"] in m.TERMINAL_EVENTS:
            self.final = event
            self._ended = True
            self._client._release(self.job_id)
        self._queue.append(event)

    def _on_attach_reply(self, reply: dict[str, Any]) -> None:
        if reply["type"] == m.ERROR:
            self._failure = ClientError.from_msg(reply)
            self._client._release(self.job_id)
