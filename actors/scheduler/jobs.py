"""What the scheduler's host remembers about each job beyond the policy's view.

The policy owns *scheduling* state (tiers, status, vruntime). This table owns the rest of
a job's life as the client sees it: who is subscribed to its events, the tokens already
streamed (ids for a resume, texts for the final ``done``), timings, and, once the job
has ended, its terminal event, kept for a while so that an ``attach`` or an idempotent
re-``submit`` gets the outcome instead of ``not_found``. It also counts the live jobs
the queue's bounds are about (``admission.py``) and holds the log-probabilities of
ended jobs to their bound (``kept_logprobs.py``).

No I/O here; the policy host writes the journal and sends the events.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import MutableSequence
from dataclasses import dataclass, field
from typing import Any

from uniun.actors.scheduler.admission import Occupancy, holder_of
from uniun.actors.scheduler.kept_logprobs import EndedLogprobs
from uniun.protocol import messages as m, runner_records as rp
from uniun.protocol.jobmap import JobSpec
from uniun.protocol.tools import parse_tool_calls

__all__ = ["JobRecord", "JobTable", "done_event", "start_command"]


@dataclass(eq=False)
class JobRecord:
    """One accepted job. Times are unix seconds (they survive a scheduler restart)."""

    spec: JobSpec
    accepted_at: float
    subscribers: set[bytes] = field(default_factory=set)
    token_ids: MutableSequence[int] = field(default_factory=list)  # an array once ended
    texts: list[str] = field(default_factory=list)
    # Packed per seq (kept_logprobs.py), if it asked; None: none for that token.
    logprobs: list[bytes | None] = field(default_factory=list)
    logprobs_dropped: bool = False  # some streamed tokens' log-probabilities are not held
    tail: str = ""  # text released only at the end
    seed: int | None = None
    started_at: float | None = None
    first_token_at: float | None = None
    prompt_tokens: int = 0
    preemptions: int = 0
    tier: int = 4
    state: str = "queued"  # queued | loading | running | pausing | paused | cancelling | ended
    on_runner: bool = False  # the current runner holds a record of this job (Drop it)
    in_sync: bool = False  # ... at exactly our token count, so a Resume will do
    started: bool = False  # a segment has started at least once (for chat: interrupted?)
    resumed: bool = False  # the current dispatch continues earlier work
    pause_reason: str | None = None  # why the host asked the runner to pause
    deaths: int = 0  # runner deaths while it ran, in a row (no token between): poison
    final: dict[str, Any] | None = None  # the terminal event once ended
    owner: str | None = None  # the CURVE key that submitted it (None: ipc or plain tcp)
    conn: bytes | None = None  # the connection that submitted it (None: replayed)

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def generated(self) -> int:
        return len(self.token_ids)

    @property
    def text(self) -> str:
        return "".join(self.texts) + self.tail

    @property
    def ended(self) -> bool:
        return self.final is not None


class JobTable:
    """Live jobs by id, plus the most recent ended ones (bounded). ``chat_kind``: the
    jobs that are not background work (the queue's bounds count the others)."""

    def __init__(self, keep_ended: int = 1000, chat_kind: str = "chat") -> None:
        self.live: dict[str, JobRecord] = {}
        self._ended: OrderedDict[str, JobRecord] = OrderedDict()
        self._keep_ended = keep_ended
        self._chat_kind = chat_kind
        self.occupancy = Occupancy()  # open background jobs, in all and per client
        self.ended_logprobs = EndedLogprobs()

    def __len__(self) -> int:
        return len(self.live)

    def get(self, job_id: str) -> JobRecord | None:
        return self.live.get(job_id) or self._ended.get(job_id)

    def add(self, record: JobRecord) -> None:
        self.live[record.job_id] = record
        if record.spec.kind != self._chat_kind:
            self.occupancy.add(holder_of(record.owner, record.conn))

    def end(self, record: JobRecord, final: dict[str, Any]) -> None:
        """Move a job to the ended list with its terminal event."""
        record.final = final
        record.state = "ended"
        record.on_runner = record.in_sync = False
        self._leave(record)
        self._ended[record.job_id] = record
        self.ended_logprobs.ended(record)
        record.token_ids = _compact(record.token_ids)
        while len(self._ended) > self._keep_ended:
            self.ended_logprobs.forget(self._ended.popitem(last=False)[1])

    def forget(self, record: JobRecord) -> None:
        """Remove a live job as if it had never been accepted (its journal write failed)."""
        self._leave(record)

    def _leave(self, record: JobRecord) -> None:
        """``record`` is no longer live (if it was: a replayed end never was)."""
        if self.live.pop(record.job_id, None) is not None \
                and record.spec.kind != self._chat_kind:
            self.occupancy.remove(holder_of(record.owner, record.conn))

    def poisoned(self) -> list[dict[str, Any]]:
        """The recent jobs that were dead-lettered as ``poisoned`` (for ``status``)."""
        return [{"job_id": r.job_id, "kind": r.spec.kind,
                 "message": (r.final or {}).get("message", "")}
                for r in self._ended.values() if (r.final or {}).get("code") == "poisoned"]

    def drop_subscriber(self, conn: bytes) -> None:
        for record in self.live.values():
            record.subscribers.discard(conn)


def _compact(token_ids: MutableSequence[int]) -> MutableSequence[int]:
    """An ended job's token ids as one array (8 bytes each instead of an int object and
    a pointer): only their count is read again, and 1,000 ended jobs are kept."""
    try:
        return array("q", token_ids)
    except OverflowError:  # an id no runner sends; keep them as they are
        return token_ids


def done_event(record: JobRecord, finish_reason: str, now: float) -> dict[str, Any]:
    """The ``done`` event of a finished job; times are measured from acceptance."""
    start = record.started_at if record.started_at is not None else now
    ttft = None if record.first_token_at is None else record.first_token_at - record.accepted_at
    calls = None
    tools = record.spec.tools
    if tools is not None and tools.active and finish_reason == "stop":
        calls = parse_tool_calls(record.text, record.job_id)
        finish_reason = "tool_calls" if calls else finish_reason
    return m.event_done(record.job_id, text=record.text, finish_reason=finish_reason,
                        prompt_tokens=record.prompt_tokens, completion_tokens=record.generated,
                        queued_s=max(0.0, start - record.accepted_at), ttft_s=ttft,
                        total_s=max(0.0, now - record.accepted_at),
                        preemptions=record.preemptions, tool_calls=calls)


def start_command(record: JobRecord, grant: int | None) -> rp.Start:
    """Everything a runner that does not know the job needs to run it (first dispatch,
    or after a runner restart): its input and the tokens already streamed."""
    spec = record.spec
    return rp.Start(
        job_id=spec.job_id, model_id=spec.model_id, job_kind=spec.kind, prompt=spec.prompt,
        messages=[list(msg) for msg in spec.messages] if spec.messages is not None else None,
        max_new_tokens=spec.max_new_tokens, sampling=spec.sampling.to_map(),
        tokens=list(record.token_ids), text="".join(record.texts), seed=record.seed,
        grant=grant or 0, stop=list(spec.stop),
        format=spec.format.to_map() if spec.format is not None else None,
        logprobs=spec.logprobs, tools=spec.tools.tools if spec.tools is not None else None,
        tool_choice=spec.tools.choice_map() if spec.tools is not None else None,
        cache_prompt=spec.cache_prompt)
