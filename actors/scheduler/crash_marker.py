"""The crash marker: which request the scheduler was validating when it died.

Why. A request that crashes the scheduler while it is validated (native code that
overflows its stack on a hostile schema, say) would crash every scheduler it is sent to,
and a client that re-sends what was unanswered after a restart, as the protocol allows,
turns one request into a crash loop that ends with the supervisor stopping the runtime.
The library's ``Client`` gives such a request up by itself (protocol/client.py); this
file is for the clients we do not write: the scheduler itself recognises a request that
was being validated at :data:`POISON_AFTER_DEATHS` of its deaths, and answers it
``poisoned`` without validating it again.

Theory of operation:

- Before the front validates a submit whose job map carries ``format`` or ``tools``
  (the submits whose validation hands client data to native code, the grammar engine),
  it writes the submit's fingerprint into the file's in-flight slot; when validation
  returns, by a reply or by an exception, it blanks the slot. A process that dies in
  between leaves the fingerprint there.
- At start, the scheduler reads the file: a fingerprint in the slot is one more death of
  that request, counted in a table of at most :data:`MAX_ENTRIES` fingerprints (the one
  that died longest ago leaves first); then the file is rewritten with the table and a
  blank slot. From then on a submit whose fingerprint has :data:`POISON_AFTER_DEATHS`
  deaths is refused ``poisoned`` before validation.
- The fingerprint hashes the job map without ``job_id`` and ``deadline``, which a
  client (or the HTTP gateway, per HTTP request) makes up per attempt: the same request
  sent again under a new id is still recognised. A request changed in any other way is
  another request, with deaths of its own.

Cost, and why no fsync. The slot is rewritten in place with one ``pwrite`` at a fixed
offset, about a microsecond; it is never flushed to the device. The death this guards
against is the process's (a signal, a stack overflow), and a write the process made
stays in the kernel's page cache when the process dies; an fsync would add a device
flush (a tenth of a millisecond and up) per validation to guard against a kernel crash
or power cut, after which the whole runtime restarts anyway. The slot is ~110 bytes in
the file's first page, so a process death cannot leave it half written. The table is
rewritten only at start (temp file, fsync, rename). Only submits with ``format`` or
``tools`` are marked: their validation compiles a grammar (hundreds of microseconds and
up), next to which the fingerprint (a hash of the job map: tens of microseconds, about
a tenth of a millisecond for a 200 000-character prompt) and two writes are small. A
plain submit validates in about ten microseconds, in pure Python, where hostile input
raises instead of killing the process; a bulk flood of those must not pay a hash each.

File format (``run/crash-marker``, mode 0600, ASCII lines)::

    uniun-crash-marker 1
    inflight <fingerprint or -> <job id or ->     (padded with spaces to SLOT_BYTES)
    <fingerprint> <deaths> <unix time of the last death>
    ...                             (at most MAX_ENTRIES, the longest-ago death first)

A fingerprint is 32 hex digits; the job id is the request's, cut to 64 characters, any
character but ``[A-Za-z0-9._:-]`` written as ``?`` (it only names the request in the
log). Lines that do not parse are skipped.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from uniun.protocol.errors import ErrorCode, ProtocolError
from uniun.protocol.jobmap import MAX_JOB_ID_CHARS

__all__ = ["CRASH_MARKER_FILE", "MAX_ENTRIES", "POISON_AFTER_DEATHS", "CrashMarker",
           "fingerprint"]

CRASH_MARKER_FILE = "crash-marker"  # in the run dir
POISON_AFTER_DEATHS = 2  # scheduler deaths while validating one request: then refused
MAX_ENTRIES = 64  # fingerprints with deaths kept; the one that died longest ago goes first
NATIVE_FIELDS = ("format", "tools")  # job-map fields whose validation runs native code
UNIQUE_PER_ATTEMPT = ("job_id", "deadline")  # job-map fields left out of the fingerprint
HEADER = b"uniun-crash-marker 1\n"
SLOT_BYTES = 108  # the in-flight line, newline included
MAX_FILE_BYTES = 64 * 1024  # a bigger file is not ours: start from an empty table
_HEX = re.compile(r"[0-9a-f]{32}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")


def fingerprint(raw: Any) -> str | None:
    """The fingerprint of a decoded request that is a submit with ``format`` or
    ``tools`` (32 hex digits), else None: the requests the crash marker watches."""
    if not isinstance(raw, dict) or raw.get("type") != "submit":
        return None
    job = raw.get("job")
    if not isinstance(job, dict) or all(job.get(f) is None for f in NATIVE_FIELDS):
        return None
    digest = hashlib.sha256()
    _feed(digest, {k: v for k, v in job.items() if k not in UNIQUE_PER_ATTEMPT})
    return digest.hexdigest()[:32]


def _feed(digest: Any, value: Any) -> None:
    """Feed ``value`` to ``digest`` without ambiguity (a type tag and a length before
    each item) and with map keys sorted, so equal maps hash equal whatever their order.
    Depth is bounded by the codec's nesting limit."""
    if isinstance(value, dict):
        digest.update(b"m%d:" % len(value))
        for key in sorted(value, key=repr):
            _feed(digest, key)
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(b"l%d:" % len(value))
        for item in value:
            _feed(digest, item)
    elif isinstance(value, (str, bytes)):
        data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
        digest.update(b"%s%d:" % (b"s" if isinstance(value, str) else b"b", len(data)))
        digest.update(data)
    else:  # None, bool, int, float: repr is exact
        digest.update(f"{type(value).__name__}{value!r};".encode())


@dataclass
class _Deaths:
    count: int
    at: float  # unix time of the last one


class CrashMarker:
    """The marker file at ``path``: counts the death the last scheduler left in it (at
    construction), then marks validations (:meth:`validating`). See the module docstring.
    """

    def __init__(self, path: Path, *, poison_after: int = POISON_AFTER_DEATHS,
                 max_entries: int = MAX_ENTRIES, wall: Callable[[], float] = time.time) -> None:
        self.path = path
        self.poison_after = poison_after
        self.max_entries = max_entries
        self._wall = wall
        self._table: OrderedDict[str, _Deaths] = OrderedDict()
        self.died_in: tuple[str, str] | None = None  # (fingerprint, job id) left in the slot
        self._load()
        self._save()
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CLOEXEC)

    @classmethod
    def open(cls, path: Path) -> CrashMarker | None:
        """The marker, or None (logged) when its file cannot be used: the scheduler then
        serves without this guard rather than not at all."""
        try:
            return cls(path)
        except OSError as err:
            logger.error("crash marker {} unusable ({}); serving without it", path, err)
            return None

    def deaths(self, fp: str) -> int:
        """Scheduler deaths counted while validating the request with this fingerprint."""
        entry = self._table.get(fp)
        return entry.count if entry is not None else 0

    @contextlib.contextmanager
    def validating(self, raw: Any) -> Iterator[None]:
        """Mark the validation of ``raw`` (a decoded request) for its duration; raise
        ``poisoned`` instead when it was being validated at ``poison_after`` deaths."""
        fp = fingerprint(raw)
        if fp is None or self._fd is None:
            yield
            return
        job_id = _job_id(raw)
        if self.deaths(fp) >= self.poison_after:
            logger.bind(job=job_id).warning(
                "refused unvalidated: the scheduler died {} times validating this request "
                "(fingerprint {})", self.deaths(fp), fp)
            raise ProtocolError(
                ErrorCode.POISONED, f"the scheduler died {self.deaths(fp)} times while "
                "validating this request; it is refused without being validated again",
                job_id=_reply_job_id(raw))
        self._write_slot(fp, job_id)
        try:
            yield
        finally:
            self._write_slot(None, None)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # ---- the file ------------------------------------------------------------------

    def _write_slot(self, fp: str | None, job_id: str | None) -> None:
        """Rewrite the in-flight slot in place (module docstring: no fsync, and why)."""
        if self._fd is None:
            return
        try:
            os.pwrite(self._fd, _slot(fp, job_id), len(HEADER))
        except OSError as err:  # the guard is lost, the scheduler is not
            logger.error("crash marker {} not writable ({}); serving without it",
                         self.path, err)
            self.close()

    def _load(self) -> None:
        """Read the table and count the death a fingerprint in the slot stands for."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return
        lines = data.decode("ascii", "replace").splitlines()
        if len(data) > MAX_FILE_BYTES or not lines or lines[0] != HEADER.decode().strip():
            logger.warning("crash marker {} is not one; starting it afresh", self.path)
            return
        for line in lines[2:]:
            self._load_entry(line.split())
        slot = lines[1].split() if len(lines) > 1 else []
        if len(slot) == 3 and slot[0] == "inflight" and _HEX.fullmatch(slot[1]):
            self._count_death(slot[1], slot[2])

    def _load_entry(self, fields: list[str]) -> None:
        try:
            fp, count, at = fields[0], int(fields[1]), float(fields[2])
        except (IndexError, ValueError):
            return
        if len(fields) == 3 and _HEX.fullmatch(fp) and count > 0:
            self._table[fp] = _Deaths(count, at)

    def _count_death(self, fp: str, job_id: str) -> None:
        entry = self._table.pop(fp, None) or _Deaths(0, 0.0)
        entry.count += 1
        entry.at = self._wall()
        self._table[fp] = entry  # the most recent death last
        self.died_in = (fp, job_id)
        log = logger.bind(job=job_id)
        if entry.count >= self.poison_after:
            log.error("the last scheduler died validating this request (fingerprint {}): "
                      "{} deaths, so it is refused as poisoned from now on", fp, entry.count)
        else:
            log.warning("the last scheduler died validating this request (fingerprint {}): "
                        "{} death(s); {} more and it is refused", fp, entry.count,
                        self.poison_after - entry.count)

    def _save(self) -> None:
        """Write the table (the most recent ``max_entries``) and a blank slot, atomically."""
        while len(self._table) > self.max_entries:
            self._table.popitem(last=False)
        lines = [f"{fp} {d.count} {d.at:.0f}\n" for fp, d in self._table.items()]
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, HEADER + _slot(None, None) + "".join(lines).encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)


def _job_id(raw: dict[str, Any]) -> str:
    """The submit's job id as the slot and the log show it (unvalidated: made safe)."""
    job_id = raw["job"].get("job_id")
    if not isinstance(job_id, str) or not job_id:
        return "-"
    return _UNSAFE.sub("?", job_id)[:64]


def _reply_job_id(raw: dict[str, Any]) -> str | None:
    """The job id to name in the refusal: the client's own, where it is one."""
    job_id = raw["job"].get("job_id")
    return job_id if isinstance(job_id, str) and 0 < len(job_id) <= MAX_JOB_ID_CHARS else None


def _slot(fp: str | None, job_id: str | None) -> bytes:
    line = f"inflight {fp or '-'} {job_id or '-'}"
    return line.ljust(SLOT_BYTES - 1).encode("ascii") + b"\n"
