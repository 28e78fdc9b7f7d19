"""The runner's store of parked jobs, under a memory cap: compact, trim, spill, drop.

Under snapshot-memory pressure (docs/kv-cache.md, "Parking many jobs") the runner first
drops the dynamic part of parked snapshots and keeps the static prefix (the system
prompt), then spills to disk, then drops. Whatever is shed, each job's
:class:`~uniun.models.kv.JobProgress` stays here, so every parked job can still resume —
from memory, from disk, from its prefix, or by recompute — with every token it already
streamed.

Victims are taken least-recently-parked first inside each stage, so the job parked last
(which the scheduler put at the *front* of its tier, and will likely resume first) keeps
its full snapshot longest. All three stages run to completion for one state before the
next stage starts on any: trimming many jobs is cheaper than spilling one. Before all
three, a state that still views its in-place KV buffer (docs/kv-cache.md) is compacted
to the positions it holds: nothing is lost but the buffer's spare capacity, and the
resume pays one copy.

Mechanism only: the caps are given by the runner's config; the order of stages is the
policy of the design and is fixed here.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from loguru import logger

from uniun.models.kv import ParkedState

__all__ = ["ParkingLot", "ParkingStats", "DEFAULT_PARKING_BYTES", "DEFAULT_SPILL_BYTES"]

# Memory for parked KV, bytes: default 256 MiB (about 5,800 SmolLM2 positions).
DEFAULT_PARKING_BYTES = 256 * 1024 * 1024
DEFAULT_SPILL_BYTES = 2 * 1024 * 1024 * 1024  # disk for spilled KV: 2 GiB


@dataclass
class ParkingStats:
    """Counts for ``status`` and logs. ``bytes`` is memory, ``disk_bytes`` spill files."""

    count: int = 0
    bytes: int = 0
    disk_bytes: int = 0
    trimmed: int = 0  # partial evictions done, cumulative
    spilled: int = 0  # spills done, cumulative
    dropped: int = 0  # KV dropped entirely (resume will recompute), cumulative


class ParkingLot:
    """Many parked jobs, keyed by job id, whose in-memory KV stays under ``max_bytes``."""

    def __init__(self, max_bytes: int = DEFAULT_PARKING_BYTES, *,
                 max_disk_bytes: int = DEFAULT_SPILL_BYTES, spill_dir: Path,
                 kv_dtype: str = "float32") -> None:
        if kv_dtype not in ("float32", "float16"):
            raise ValueError(f"kv_dtype must be float32 or float16, not {kv_dtype!r}")
        # float16: parked KV is stored at half the bytes (twice the jobs under the cap),
        # at the price of a conversion copy on park and on resume and a rounding of
        # every key and value (docs/kv-cache.md measures what that does to the output).
        self.kv_dtype = kv_dtype
        self.max_bytes = int(max_bytes)
        self.max_disk_bytes = int(max_disk_bytes)  # 0 disables spilling
        self._spill_dir = spill_dir
        self._states: OrderedDict[str, ParkedState] = OrderedDict()  # oldest parked first
        self._disk: dict[str, int] = {}  # job id -> spill file size
        self._stats = ParkingStats()

    # -- the map ------------------------------------------------------------------------
    def __contains__(self, job_id: object) -> bool:
        return job_id in self._states

    def __len__(self) -> int:
        return len(self._states)

    def job_ids(self) -> list[str]:
        """Parked job ids, least recently parked first."""
        return list(self._states)

    def get(self, job_id: str) -> ParkedState | None:
        """Look without taking (the state stays parked and keeps its place)."""
        return self._states.get(job_id)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._states.values())

    @property
    def disk_bytes(self) -> int:
        return sum(self._disk.values())

    def stats(self) -> ParkingStats:
        s = self._stats
        return ParkingStats(len(self._states), self.nbytes, self.disk_bytes,
                            s.trimmed, s.spilled, s.dropped)

    def park(self, job_id: str, state: ParkedState) -> None:
        """Add (or replace) a job's parked state, then shed memory until under the cap."""
        old = self._states.pop(job_id, None)
        if old is not None and old is not state:
            old.discard_spill()
            self._disk.pop(job_id, None)
        if self.kv_dtype == "float16" and state.kv is not None \
                and state.kv.dtype != np.float16:
            state.kv = state.kv.compact(np.float16)
        self._states[job_id] = state
        self.enforce()

    def take(self, job_id: str) -> ParkedState:
        """Remove and return a job's state (to resume it). ``KeyError`` if not parked."""
        state = self._states.pop(job_id)
        self._disk.pop(job_id, None)
        return state

    def discard(self, job_id: str) -> bool:
        """Forget a job (cancelled, or done elsewhere): memory freed, spill file deleted."""
        state = self._states.pop(job_id, None)
        self._disk.pop(job_id, None)
        if state is None:
            return False
        state.drop_kv()
        return True

    def clear(self) -> None:
        for job_id in list(self._states):
            self.discard(job_id)

    # -- shedding -------------------------------------------------------------------------
    def enforce(self) -> list[tuple[str, str]]:
        """Shed memory until under ``max_bytes``: trim, spill, drop. Returns what was done."""
        actions: list[tuple[str, str]] = []
        used = self.nbytes
        if used <= self.max_bytes:
            return actions
        for stage in ("compact", "trim", "spill", "drop"):
            for job_id, state in list(self._states.items()):
                if used <= self.max_bytes:
                    return actions
                if state.nbytes == 0:
                    continue
                freed = self._shed(stage, job_id, state)
                if freed:
                    used -= freed
                    actions.append((job_id, stage))
        return actions

    def _shed(self, stage: str, job_id: str, state: ParkedState) -> int:
        log = logger.bind(job=job_id)
        if stage == "compact":  # loses nothing: the spare capacity of an in-place buffer
            if state.kv is None or state.kv.buffer is None:
                return 0
            before = state.nbytes
            state.kv = state.kv.compact()
            return before - state.nbytes
        if stage == "trim":
            if state.progress.static_prefix <= 0:
                return 0  # trimming to nothing would be a drop, the last resort
            freed = state.evict_to_prefix()
            if freed:
                self._stats.trimmed += 1
                log.info("parked KV trimmed to its {}-token prefix ({} bytes freed)",
                         state.kv_length, freed)
            return freed
        if stage == "spill":
            before = state.nbytes
            if self.max_disk_bytes <= 0 or self.disk_bytes + before > self.max_disk_bytes:
                return 0
            try:
                path = state.spill(_spill_path(self._spill_dir, job_id))
            except OSError as exc:
                log.warning("spilling parked KV failed ({}); it will be dropped instead", exc)
                return 0
            self._disk[job_id] = path.stat().st_size
            self._stats.spilled += 1
            log.info("parked KV spilled to {} ({} bytes freed)", path, before)
            return before
        freed = state.drop_kv()
        self._disk.pop(job_id, None)
        self._stats.dropped += 1
        log.info("parked KV dropped ({} bytes freed); the job will resume by recompute", freed)
        return freed


def _spill_path(directory: Path, job_id: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_id)[:80]
    digest = hashlib.sha1(job_id.encode()).hexdigest()[:10]  # "a/b" and "a_b" differ
    return directory / f"{safe}-{digest}.kvsnap"
