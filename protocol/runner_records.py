"""The internal contract between the scheduler and the runner process.

Theory of operation (read this before changing anything here):

- The scheduler owns *logical* state (which job runs, what was streamed); the runner owns
  the *physical* state (the decoder session, KV caches, parked snapshots). Across the
  socket go small frozen records: **commands** ("what to do") out, **reports** ("what
  happened") in. Both are plain dataclasses of ids and counts, msgpack-encoded as one map
  per frame with the record's name under ``"t"``.
- A job's first dispatch to a runner is a :class:`Start` with everything the runner needs
  (input, sampling, the ids already streamed). After that only what changed travels: a
  :class:`Resume` with the number of tokens the scheduler has streamed and the token
  grant of this segment. The runner keeps a small record per job it was told about (input
  ids, generated ids, effective seed) until it is told to :class:`Drop` the job, so a
  parked job can always resume: from its snapshot if one survived, else by recomputing.
- ``generated`` counts agree on both sides: the scheduler streams token ``seq`` only once;
  a :class:`Resume` whose count does not match the runner's record makes the runner
  recompute from the first ``generated`` tokens (never start over, never re-stream).
- Runner time: every report of a segment (``Token``, ``Paused``, ``Finished``,
  ``Cancelled``, ``Failed``) carries ``seconds``, the runner time used since the previous
  report of that segment, so the scheduler charges vruntime as it goes (a running fair-pool
  job is re-examined after each time slice) and the sum is the segment's cost.
- Liveness: both sides send :class:`Heartbeat` on this same data socket every
  ``heartbeat_s``; a peer silent for three intervals is dead (``protocol/liveness.py``).
  Each side carries a ``boot`` id, new at every process start, so a restart of either
  side is noticed at the first message, without waiting for silence.
- Sockets: the scheduler binds a ROUTER at :func:`runner_endpoint`; the runner connects a
  DEALER whose routing id is ``runner-<pid>-<boot>``. The scheduler addresses only the
  runner that said :class:`Hello` last, so a half-dead old runner can never receive work.

No I/O in this module: any socket layer drives it (as the protocol codec does).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import msgpack

from uniun.protocol.home import run_dir

__all__ = [
    "BadRecord", "Command", "Report", "Load", "Start", "Resume", "Pause", "Cancel", "Drop",
    "Hello", "Heartbeat", "ModelLoaded", "LoadFailed", "Started", "Token", "Paused",
    "Finished", "Cancelled", "Unknown", "Failed", "encode", "decode", "new_boot", "runner_endpoint",
]

MAX_FRAME_BYTES = 64 << 20  # a Start carries a prompt; 64 MiB bounds a corrupt frame


class BadRecord(ValueError):
    """A frame that is not one of the records below (a local bug, or a foreign peer)."""


def new_boot() -> str:
    """A fresh id for this process start."""
    return secrets.token_hex(6)


def runner_endpoint(directory: Path | None = None) -> str:
    """Where the scheduler binds and the runner connects (an ipc socket in the run dir)."""
    return f"ipc://{(directory or run_dir()) / 'runner.sock'}"


def runner_identity(boot: str) -> bytes:
    """The runner DEALER's routing id; unique per process start."""
    return f"runner-{os.getpid()}-{boot}".encode()


_REGISTRY: dict[str, type[Record]] = {}


@dataclass(frozen=True)
class Record:
    """Base of every command and report; ``kind`` is the wire name."""

    kind: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            _REGISTRY[cls.kind] = cls


class Command(Record):
    """Scheduler -> runner."""


class Report(Record):
    """Runner -> scheduler."""


# ---- commands ------------------------------------------------------------------------


@dataclass(frozen=True)
class Load(Command):
    """Make ``model_id`` the loaded model (swap out whatever is loaded; parked jobs stay)."""

    kind: ClassVar[str] = "load"
    model_id: str


@dataclass(frozen=True)
class Start(Command):
    """Run a job this runner does not know yet: fresh, or continuing after ``tokens``.

    ``tokens`` are the ids the scheduler has already streamed (empty for a fresh job),
    ``text`` the text it streamed for them;
    the runner continues from a snapshot it still holds for exactly those tokens, else it
    recomputes them. ``seed`` is the job's effective sampling seed once one was drawn.
    ``grant`` is how many tokens this segment may generate (0 = up to ``max_new_tokens``).
    ``stop`` and ``format`` are the job map's extensions: stop strings, and the output
    format the runner enforces by constrained decoding (``models/constrain.py``); so are
    ``logprobs`` (alternatives per token, None = none), ``tools`` with ``tool_choice``
    (``protocol/tools.py``) and ``cache_prompt``. A message is ``[role, content]``, or
    ``[role, content, extra]`` with the JSON of its tool calls or tool-result keys.
    """

    kind: ClassVar[str] = "start"
    job_id: str
    model_id: str
    job_kind: str
    prompt: str | None
    messages: list[list[str]] | None
    max_new_tokens: int
    sampling: dict[str, Any]
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    seed: int | None = None
    grant: int = 0
    stop: list[str] = field(default_factory=list)
    format: dict[str, Any] | None = None
    logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    cache_prompt: bool = False

    def message_maps(self) -> list[dict[str, Any]] | None:
        """The messages as the session's ``{role, content, ...}`` maps."""
        if self.messages is None:
            return None
        return [{"role": m[0], "content": m[1], **(json.loads(m[2]) if len(m) > 2 else {})}
                for m in self.messages]


@dataclass(frozen=True)
class Resume(Command):
    """Continue a job this runner knows, after ``generated`` streamed tokens."""

    kind: ClassVar[str] = "resume"
    job_id: str
    generated: int
    grant: int = 0


@dataclass(frozen=True)
class Pause(Command):
    """Stop the running job at the next token boundary and park its KV cache."""

    kind: ClassVar[str] = "pause"
    job_id: str


@dataclass(frozen=True)
class Cancel(Command):
    """Stop the job at the next token boundary (or now, if parked) and forget it."""

    kind: ClassVar[str] = "cancel"
    job_id: str


@dataclass(frozen=True)
class Drop(Command):
    """Forget a job that is not running (its snapshot and its record)."""

    kind: ClassVar[str] = "drop"
    job_id: str


@dataclass(frozen=True)
class Heartbeat(Command):
    """Both directions: "I am alive".

    The runner's carries its snapshot totals. The scheduler answers each runner
    heartbeat with its own, whose ``ack`` is the boot of the runner it currently works
    with ("" if none): a runner that reads another value than its own boot is unknown to
    this scheduler (a restarted scheduler, or one that declared it dead) and says
    :class:`Hello` again, after parking whatever it was running — but only when the
    echoed ``seq`` shows the scheduler read a beat sent *after* the runner's last Hello
    (messages from one peer arrive in order), so a reply that merely crossed the Hello
    never causes a second one.
    """

    kind: ClassVar[str] = "hb"
    boot: str
    ack: str = ""
    seq: int = 0  # the runner numbers its beats; the scheduler echoes the last it read
    snapshots: int = 0
    snapshot_bytes: int = 0
    trimmed: int = 0  # partial evictions of parked snapshots since the runner started
    spilled: int = 0  # ... and spills to disk
    quiet_s: float = 0.0  # the runner is about to be silent this long (a model load)


# ---- reports -------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello(Report):
    """Sent by the runner on start and whenever it sees a new scheduler boot.

    ``jobs`` maps each job the runner holds a record for to its generated-token count;
    nothing is running when Hello is sent (a running job is paused first).
    """

    kind: ClassVar[str] = "hello"
    boot: str
    pid: int
    model_id: str | None
    jobs: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelLoaded(Report):
    kind: ClassVar[str] = "loaded"
    model_id: str
    seconds: float


@dataclass(frozen=True)
class LoadFailed(Report):
    kind: ClassVar[str] = "load_failed"
    model_id: str
    message: str


@dataclass(frozen=True)
class Started(Report):
    """A segment began. ``recomputed`` tokens were re-prefilled (0 on a snapshot resume)."""

    kind: ClassVar[str] = "started"
    job_id: str
    resumed: bool
    prompt_tokens: int
    recomputed: int
    seed: int


@dataclass(frozen=True)
class Token(Report):
    """One generated token. ``seq`` is 0-based over the whole job. ``logprobs``, for a job
    that asked: ``[text, bytes, logprob, [[text, bytes, logprob], ...]]``, the token and its
    most likely alternatives, compact because the runner builds it in its decode loop;
    the scheduler expands it to the ``token`` event's shape (``messages.expand_logprobs``)."""

    kind: ClassVar[str] = "token"
    job_id: str
    seq: int
    token_id: int
    text: str
    seconds: float = 0.0
    logprobs: list[Any] | None = None


@dataclass(frozen=True)
class Paused(Report):
    """The segment ended with the job parked. ``grant_spent``: it ran out of its grant."""

    kind: ClassVar[str] = "paused"
    job_id: str
    generated: int
    seconds: float
    grant_spent: bool = False


@dataclass(frozen=True)
class Finished(Report):
    """The job is complete. ``tail`` is text released only at the end (detokeniser flush)."""

    kind: ClassVar[str] = "finished"
    job_id: str
    finish_reason: str
    prompt_tokens: int
    generated: int
    seconds: float
    tail: str = ""


@dataclass(frozen=True)
class Cancelled(Report):
    kind: ClassVar[str] = "cancelled"
    job_id: str
    seconds: float


@dataclass(frozen=True)
class Unknown(Report):
    """Answer to a :class:`Resume` the runner cannot honour as described (no record, or
    another token count): the scheduler sends a full :class:`Start` instead."""

    kind: ClassVar[str] = "unknown"
    job_id: str


@dataclass(frozen=True)
class Failed(Report):
    """The job cannot run (bad input for this model, session error). Not retried."""

    kind: ClassVar[str] = "failed"
    job_id: str
    message: str
    seconds: float = 0.0


# ---- codec ---------------------------------------------------------------------------


def encode(record: Record) -> bytes:
    """One record as one frame."""
    body = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    body["t"] = record.kind
    return msgpack.packb(body, use_bin_type=True)


def decode(frame: bytes) -> Record:
    """One frame back to its record; :class:`BadRecord` if it is not one."""
    if len(frame) > MAX_FRAME_BYTES:
        raise BadRecord(f"frame of {len(frame)} bytes is over the limit")
    try:
        body = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as err:  # noqa: BLE001 - msgpack raises several unrelated types
        raise BadRecord(f"not msgpack: {err}") from None
    if not isinstance(body, dict):
        raise BadRecord("not a map")
    cls = _REGISTRY.get(body.pop("t", None))
    if cls is None:
        raise BadRecord("unknown record type")
    try:
        return cls(**body)
    except TypeError as err:
        raise BadRecord(f"{cls.kind}: {err}") from None
