"""The log-probabilities the scheduler keeps for ``attach`` replays, and their bound (pure).

Why: a job with ``logprobs: 20`` gets 21 tokens' text, bytes and log-probability with
every token. Expanded into the ``token`` event's maps that is thousands of Python
objects per token, and the scheduler keeps the 1,000 most recently ended jobs for
``attach``; so one client asking ``top_logprobs: 20`` could grow the scheduler by
gigabytes. Two rules bound it:

- **Packed.** A token's record is kept as the runner sent it (``[text, bytes, logprob,
  [[text, bytes, logprob], ...]]``) packed with msgpack, about half a kilobyte at
  ``logprobs: 20``, and expanded again only when it is re-sent.
- **Ended jobs keep them while they fit.** When a job ends it keeps its packed records
  if they total at most :data:`ENDED_JOB_BYTES`, and all ended jobs together keep at most
  :data:`ENDED_TOTAL_BYTES`: past that, the jobs that ended first give theirs up. A job
  that gave them up is marked ``logprobs_dropped``; an ``attach`` then re-sends its
  tokens without ``logprobs`` and says so in its reply (docs/protocol.md, "attach").
  Its text and its terminal event are kept as before.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol

import msgpack

from uniun.protocol import messages as m

__all__ = ["ENDED_JOB_BYTES", "ENDED_TOTAL_BYTES", "EndedLogprobs", "pack", "unpack"]

MIB = 1024 * 1024
ENDED_JOB_BYTES = 1 * MIB  # packed log-probabilities one ended job may keep
ENDED_TOTAL_BYTES = 8 * MIB  # ... all ended jobs together; the first ended give theirs up


def pack(record: Any) -> bytes:
    """One token's compact record from the runner, packed (msgpack keeps str, bytes and
    floats as they are, so :func:`unpack` expands to the map that was sent live)."""
    return msgpack.packb(record, use_bin_type=True)


def unpack(packed: bytes | None) -> dict[str, Any] | None:
    """The ``token`` event's ``logprobs`` map of a packed record (None: none kept)."""
    return None if packed is None else m.expand_logprobs(msgpack.unpackb(packed, raw=False))


class JobRecord(Protocol):
    """What this module reads and changes of a job (``jobs.JobRecord``)."""

    logprobs: list[bytes | None]
    logprobs_dropped: bool

    @property
    def job_id(self) -> str: ...


def kept_bytes(record: JobRecord) -> int:
    return sum(len(b) for b in record.logprobs if b is not None)


class EndedLogprobs:
    """Which ended jobs still keep their log-probabilities, and how many bytes they hold."""

    def __init__(self, job_bytes: int = ENDED_JOB_BYTES,
                 total_bytes: int = ENDED_TOTAL_BYTES) -> None:
        self.job_bytes = job_bytes
        self.total_bytes = total_bytes
        self.bytes = 0
        self._kept: OrderedDict[str, tuple[JobRecord, int]] = OrderedDict()

    def ended(self, record: JobRecord) -> None:
        """``record`` just ended: keep its log-probabilities if they fit, else drop them;
        then drop those of the jobs that ended first until all fit."""
        size = kept_bytes(record)
        if not size:
            return
        if size > self.job_bytes:
            _drop(record)
            return
        self._kept[record.job_id] = (record, size)
        self.bytes += size
        while self.bytes > self.total_bytes:
            _, (first, first_size) = self._kept.popitem(last=False)
            self.bytes -= first_size
            _drop(first)

    def forget(self, record: JobRecord) -> None:
        """``record`` is no longer kept at all (the ended list let it go)."""
        entry = self._kept.pop(record.job_id, None)
        if entry is not None:
            self.bytes -= entry[1]


def _drop(record: JobRecord) -> None:
    record.logprobs = []
    record.logprobs_dropped = True
