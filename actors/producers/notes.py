"""The notes folder as the extract producer sees it: files, content hashes, pacing.

A note is identified by its path relative to the notes folder and its content hash:
the same text always maps to the same extraction job id, so a restarted producer finds
its earlier jobs instead of submitting them again, and an edited note gets a new job.
Scanning polls (no inotify dependency) and re-hashes only files whose size or mtime
changed. :class:`Pacer` (a token bucket, clock passed in) holds the backfill of existing
notes to a configured rate.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from uniun.actors.producers.ids import unguessable_id

NOTE_SUFFIXES = (".md", ".txt")
DEFAULT_MAX_NOTE_BYTES = 1024 * 1024  # larger files are skipped, not truncated silently


@dataclass(frozen=True)
class NoteFile:
    rel: str  # path relative to the notes folder, '/'-separated
    sha: str  # sha256 of the bytes
    size: int
    mtime_ns: int


def scan_notes(root: Path, previous: dict[str, NoteFile] | None = None, *,
               max_bytes: int = DEFAULT_MAX_NOTE_BYTES) -> dict[str, NoteFile]:
    """Every ``.md``/``.txt`` note under ``root`` (hidden files and folders skipped)."""
    previous = previous or {}
    out: dict[str, NoteFile] = {}
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or not name.lower().endswith(NOTE_SUFFIXES):
                continue
            path = Path(dirpath) / name
            try:
                st = path.stat()
            except OSError:
                continue  # removed while we looked
            if st.st_size > max_bytes:
                continue
            rel = path.relative_to(root).as_posix()
            old = previous.get(rel)
            if old is not None and (old.size, old.mtime_ns) == (st.st_size, st.st_mtime_ns):
                out[rel] = old
                continue
            try:
                data = path.read_bytes()
            except OSError:
                continue
            out[rel] = NoteFile(rel, note_hash(data), len(data), st.st_mtime_ns)
    return out


def note_hash(data: bytes) -> str:
    """The content hash that names a note's text (knowledge rows, extraction job ids)."""
    return hashlib.sha256(data).hexdigest()


def read_note(root: Path, rel: str) -> str:
    """A note's text; undecodable bytes become U+FFFD rather than failing the job."""
    return (root / rel).read_bytes().decode("utf-8", errors="replace")


def note_title(rel: str, text: str) -> str:
    """The first Markdown heading, else the file name without its suffix."""
    for line in text.splitlines()[:20]:
        stripped = line.strip()
        if stripped.startswith("#"):
            title = stripped.lstrip("#").strip()
            if title:
                return title[:200]
    return Path(rel).stem


def extract_job_prefix(rel: str, sha: str) -> str:
    """What every extraction job id of this note text starts with (attempts follow)."""
    path_tag = hashlib.sha256(rel.encode()).hexdigest()[:12]
    return f"extract-{path_tag}-{sha[:16]}-"


def extract_job_id(rel: str, sha: str, attempt: int = 0) -> str:
    """A new id for an extraction of this note text (``attempt`` after failures), with a
    random tag (``ids.py``): a client that knows the note could compute the rest."""
    return unguessable_id(f"{extract_job_prefix(rel, sha)}{attempt}")


class Pacer:
    """A token bucket: ``rate_per_s`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, rate_per_s: float, burst: float = 1.0, *, now: float = 0.0) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("need rate_per_s > 0 and burst >= 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._tokens = burst
        self._at = now

    def available(self, now: float) -> int:
        """Whole tokens available at ``now`` (refills since the last call)."""
        self._tokens = min(self.burst, self._tokens + max(0.0, now - self._at) * self.rate_per_s)
        self._at = max(self._at, now)
        return int(self._tokens)

    def take(self, now: float, n: int = 1) -> bool:
        if self.available(now) < n:
            return False
        self._tokens -= n
        return True
