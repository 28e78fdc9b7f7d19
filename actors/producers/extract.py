"""The extract producer: notes in, extracted knowledge and note embeddings out.

Every ``scan_interval_s`` it scans the notes folder. A note whose current text has no
stored extraction and no open job gets one:

- notes that are **new or changed while the producer runs** are submitted at once
  (kind ``extract``; the scheduler's T2 budget still governs them);
- notes that were **already there at start** (the backlog, e.g. a first run over 500
  notes) form the *backfill*, submitted at ``backfill_per_s`` and never more than
  ``max_in_flight`` open at a time, so the scheduler's queue is not flooded and the
  order of work stays the producer's.

A note's embedding is computed by the embedding pool (never the scheduler) whenever the
stored one is of an older text; a note that disappears loses its embedding (search
must not return it) but keeps its extracted knowledge (history).

``uniun-runtime open-note`` supersedes a queued extraction of the opened note with a
``foreground_hint`` job of its own (``runtime.commands.open_note``); the producer sees
the superseded job's ``cancelled`` and leaves it alone. The command follows and stores
its job itself, stamped with its pid (``owners.py``); if it is killed, the producer
adopts the job at its next sweep (every 5 s or so), or, for a job without a stamp,
after ``ORPHAN_AFTER_S``. A job that failed is tried again
under a new attempt number, at most ``max_attempts`` times per note text.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger

from uniun.actors.producers.extraction import (
    EXTRACTION_FORMAT,
    extraction_messages,
    parse_extraction,
)
from uniun.actors.producers.jobs import JobTracker
from uniun.actors.producers.notes import (
    NoteFile,
    Pacer,
    extract_job_id,
    extract_job_prefix,
    note_title,
    read_note,
    scan_notes,
)
from uniun.actors.producers.owners import owner_gone
from uniun.actors.producers.results import ResultsStore

NAME = "extract"
OPEN_NOTE = "open-note"  # producer name of the jobs `uniun-runtime open-note` submits
ORPHAN_AFTER_S = 600.0  # an open-note job untouched this long lost its command: adopt it
Embedder = Callable[[list[str]], np.ndarray]


@dataclass(frozen=True)
class ExtractSettings:
    notes_dir: Path
    scan_interval_s: float = 2.0  # seconds between scans of the notes folder
    backfill_per_s: float = 1.0  # backlog notes submitted per second (seed scenario 5)
    max_in_flight: int = 8  # open extraction jobs at most
    max_new_tokens: int = 256  # the schema's bounds fit in it (docs/structured-output.md)
    constrained: bool = True  # ask for EXTRACTION_FORMAT (False: free text, parsed leniently)
    model_id: str | None = None  # None: the scheduler's default (chat) model
    max_attempts: int = 3  # per note text, counting failed and cancelled jobs
    embed_batch: int = 16  # notes per embedding request
    embed_retry_s: float = 10.0  # back-off after the embedding pool failed


def note_job(rel: str, sha: str, text: str, attempt: int, settings: ExtractSettings, *,
             hint: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job map and the meta the result needs, for one extraction of one note text."""
    job: dict[str, Any] = {
        "job_id": extract_job_id(rel, sha, attempt), "kind": "extract",
        "messages": extraction_messages(text, title=note_title(rel, text)),
        "max_new_tokens": settings.max_new_tokens, "foreground_hint": hint,
    }
    if settings.constrained:
        job["format"] = EXTRACTION_FORMAT  # constrained decoding: the answer always parses
    if settings.model_id:
        job["model_id"] = settings.model_id
    return job, {"note_path": rel, "note_sha": sha, "hint": hint}


def store_extraction(store: ResultsStore, row: dict[str, Any], done: dict[str, Any]) -> None:
    """Parse a finished extraction and store it (raw always; parsed or the parse error)."""
    meta, text = row["meta"], done.get("text", "")
    result = parse_extraction(text)
    store.add_knowledge(job_id=row["job_id"], note_path=meta["note_path"],
                        note_sha=meta["note_sha"], model_id=done.get("model_id")
                        or row["job"].get("model_id"), raw=text, parsed=result.parsed,
                        parse_error=result.error, finish_reason=done.get("finish_reason"),
                        total_s=(done.get("timings") or {}).get("total_s"))
    log = logger.bind(job=row["job_id"])
    if result.error:
        log.info("extraction of {} stored with a parse failure: {}", meta["note_path"],
                 result.error)
    else:
        log.info("extracted {} entities, {} relations from {}",
                 len(result.parsed["entities"]), len(result.parsed["relations"]),  # type: ignore[index]
                 meta["note_path"])


class ExtractProducer:
    """The extract producer's logic (driven by ``ProducerActor``)."""

    name = NAME

    def __init__(self, settings: ExtractSettings, store: ResultsStore, tracker: JobTracker | None,
                 *, embed: Embedder | None = None, now: float = 0.0) -> None:
        self.settings = settings
        self.store = store
        self.tracker = tracker
        self.embed = embed
        self.notes: dict[str, NoteFile] | None = None  # None until the first scan
        self.backlog: deque[tuple[str, str, int]] = deque()
        # Submissions happen once per scan, so the bucket must hold a scan's worth.
        self.pacer = Pacer(settings.backfill_per_s,
                           burst=max(1.0, settings.backfill_per_s * settings.scan_interval_s),
                           now=now)
        self._next_scan = now
        self._next_sweep = now
        self._embed_after = now
        self._skipped: set[tuple[str, str]] = set()

    @classmethod
    def with_tracker(cls, settings: ExtractSettings, store: ResultsStore, client: Any,
                     **kwargs: Any) -> ExtractProducer:
        tracker = JobTracker(NAME, client, store,
                             on_done=lambda row, done: store_extraction(store, row, done))
        return cls(settings, store, tracker, **kwargs)

    # -- planning (no scheduler involved: testable with a fake tracker) -------------------

    def next_attempt(self, rel: str, sha: str) -> int | None:
        """The attempt number to submit for this note text, or None if none is needed."""
        if self.store.has_knowledge(rel, sha):
            return None
        rows = self.store.jobs_with_prefix(extract_job_prefix(rel, sha))
        if any(r["state"] in ("pending", "submitted", "done") for r in rows):
            return None  # in flight, or done (its knowledge is being stored)
        if len(rows) >= self.settings.max_attempts:
            if (rel, sha) not in self._skipped:
                self._skipped.add((rel, sha))
                logger.warning("giving up on {}: {} extraction attempts failed", rel, len(rows))
            return None
        return len(rows)

    def scan(self) -> tuple[list[tuple[str, str, int]], list[NoteFile]]:
        """Scan the folder; return (live work to submit now, notes needing an embedding)."""
        first = self.notes is None
        previous = self.notes or {}
        current = scan_notes(self.settings.notes_dir, previous)
        live: list[tuple[str, str, int]] = []
        backlog: list[tuple[str, str, int]] = []
        for rel, note in current.items():
            attempt = self.next_attempt(rel, note.sha)
            if attempt is None:
                continue
            changed = rel not in previous or previous[rel].sha != note.sha
            (live if changed and not first else backlog).append((rel, note.sha, attempt))
        for rel in previous.keys() - current.keys():
            self.store.delete_note_embedding(rel)
        self.notes = current
        self.backlog = deque(backlog)
        stale = [n for n in current.values() if self.store.embedded_sha(n.rel) != n.sha]
        return live, stale

    # -- the tick -------------------------------------------------------------------------

    def step(self, now: float) -> None:
        if self.tracker is not None and now >= self._next_sweep:
            adopted = self.store.adopt_jobs(OPEN_NOTE, NAME, ORPHAN_AFTER_S,
                                            owner_gone=owner_gone)
            if adopted:
                logger.info("adopted {} open-note job(s) whose command went away", adopted)
            self.tracker.sweep()
            self._next_sweep = now + max(5.0, self.settings.scan_interval_s)
        if now < self._next_scan:
            return
        self._next_scan = now + self.settings.scan_interval_s
        live, stale = self.scan()
        for rel, sha, attempt in live:
            self.submit(rel, sha, attempt)
        open_jobs = self.tracker.in_flight() if self.tracker is not None else 0
        while self.backlog and open_jobs < self.settings.max_in_flight and self.pacer.take(now):
            rel, sha, attempt = self.backlog.popleft()
            if self.submit(rel, sha, attempt):
                open_jobs += 1
        if stale and self.embed is not None and now >= self._embed_after:
            self.embed_notes(stale[: self.settings.embed_batch], now)

    def submit(self, rel: str, sha: str, attempt: int) -> bool:
        try:
            text = read_note(self.settings.notes_dir, rel)
        except OSError as err:
            logger.warning("cannot read note {}: {}", rel, err)
            return False
        job, meta = note_job(rel, sha, text, attempt, self.settings)
        if self.tracker is None or not self.tracker.add(job, meta):
            return False
        logger.bind(job=job["job_id"]).info("submitted extraction of {}", rel)
        return True

    def embed_notes(self, notes: list[NoteFile], now: float) -> None:
        texts = []
        for note in notes:
            try:
                texts.append(read_note(self.settings.notes_dir, note.rel))
            except OSError:
                texts.append("")
        try:
            assert self.embed is not None
            vectors = self.embed(texts)
        except Exception as err:  # noqa: BLE001 - pool down, queue_full, ...: try again later
            logger.info("embedding {} note(s) failed ({}); retrying in {:.0f}s", len(notes), err,
                        self.settings.embed_retry_s)
            self._embed_after = now + self.settings.embed_retry_s
            return
        for note, vector in zip(notes, vectors):
            self.store.put_note_embedding(note.rel, note.sha, vector)
        logger.info("embedded {} note(s)", len(notes))

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
