"""The gana-cron producer: fires the Ganas of ``ganas.toml`` through the scheduler.

Each check (default every second), while the lifecycle is ``foreground``:

1. it adopts background claims whose owner died (``results_fires.adopt_expired``);
2. for each Gana it claims the due slot in the results database and submits the fire as
   a ``gana`` job with ``deadline`` = the slot and ``flow`` = the Gana's id (stable job
   id ``gana-<id>-<slot ms>``). Slots are due ``lead_s`` early, so a fire usually runs
   in the fair pool before its time and is promoted to T3 only if it is late.

While the lifecycle is ``background`` it claims nothing (the background-Gana process
fires instead), but jobs already submitted stay with the scheduler, which serves them
under its governor, and their results are still recorded here when they finish.

Crash safety: a claim and its job row are written in two steps; an open ``cron`` claim
without a job row (killed in between) is submitted on the next check. Open jobs are
re-attached by the tracker. ``ganas.toml`` is re-read when it changes; a broken file is
reported and the previous Ganas keep firing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from loguru import logger

from uniun.actors.producers.gana_schedule import (
    GanaConfigError,
    GanaDef,
    due_slot,
    fire_job_id,
    gana_job,
    load_ganas,
)
from uniun.actors.producers.jobs import JobTracker
from uniun.actors.producers.lifecycle import FOREGROUND, LifecycleWatch
from uniun.actors.producers.results import ResultsStore
from uniun.actors.producers.results_fires import (
    OWNER_CRON,
    Fire,
    adopt_expired,
    claim_fire,
    finish_fire,
    open_fires,
)

NAME = "gana"


@dataclass(frozen=True)
class GanaSettings:
    ganas_file: Path
    lead_s: float = 60.0  # a slot is submitted this many seconds before its time
    check_interval_s: float = 1.0  # seconds between checks for due Ganas
    max_new_tokens_cap: int | None = None


class GanaFile:
    """``ganas.toml``, re-read when its mtime changes; a broken edit keeps the old Ganas."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ganas: dict[str, GanaDef] = {}
        self._stamp: tuple[int, int] | None = None

    def load(self) -> dict[str, GanaDef]:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = (0, -1)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self.ganas = {g.id: g for g in load_ganas(self.path)}
                logger.info("{} Gana(s) from {}", len(self.ganas), self.path)
            except GanaConfigError as err:
                logger.error("{}; keeping the previous {} Gana(s)", err, len(self.ganas))
        return self.ganas


def run_fields(row: dict[str, Any], done: dict[str, Any], runner: str) -> dict[str, Any]:
    """A ``gana_runs`` row from a ``done`` event."""
    timings = done.get("timings") or {}
    usage = done.get("usage") or {}
    messages = row["job"].get("messages") or []
    return {"runner": runner, "model_id": done.get("model_id") or row["job"].get("model_id"),
            "prompt": messages[-1]["content"] if messages else row["job"].get("prompt", ""),
            "text": done.get("text", ""), "finish_reason": done.get("finish_reason"),
            "completion_tokens": usage.get("completion_tokens"),
            "queued_s": timings.get("queued_s"), "ttft_s": timings.get("ttft_s"),
            "total_s": timings.get("total_s"), "preemptions": done.get("preemptions")}


def _fire_of(row: dict[str, Any]) -> Fire:
    meta = row["meta"]
    return Fire(meta["gana_id"], meta["slot"], row["job_id"], OWNER_CRON)


class GanaCron:
    name = NAME

    def __init__(self, settings: GanaSettings, store: ResultsStore, tracker: JobTracker | None,
                 lifecycle: LifecycleWatch, *, now: float = 0.0) -> None:
        self.settings = settings
        self.store = store
        self.tracker = tracker
        self.lifecycle = lifecycle
        self.file = GanaFile(settings.ganas_file)
        self._next_check = now

    @classmethod
    def with_tracker(cls, settings: GanaSettings, store: ResultsStore, client: Any,
                     lifecycle: LifecycleWatch, **kwargs: Any) -> GanaCron:
        tracker = JobTracker(
            NAME, client, store,
            on_done=lambda row, done: finish_fire(store, _fire_of(row),
                                                  run_fields(row, done, "scheduler")),
            on_error=lambda row, event: finish_fire(
                store, _fire_of(row), None, failed=f"{event.get('code')}"))
        return cls(settings, store, tracker, lifecycle, **kwargs)

    def step(self, now: float) -> None:
        if now < self._next_check or self.tracker is None:
            return
        self._next_check = now + self.settings.check_interval_s
        ganas = self.file.load()
        self.tracker.sweep()
        for fire in open_fires(self.store, OWNER_CRON):
            if self.store.job(fire.job_id) is None:  # claimed, then killed before submitting
                self.submit(fire, ganas)
        if self.lifecycle.current(now) != FOREGROUND:
            return
        for fire in adopt_expired(self.store, OWNER_CRON, now=now):
            logger.bind(job=fire.job_id).info("adopting an unfinished background fire of {}",
                                              fire.gana_id)
            self.submit(fire, ganas)
        for gana in ganas.values():
            claimed = claim_fire(self.store, gana.id, owner=OWNER_CRON,
                                 due=partial(due_slot, every_s=gana.every_s, now=now,
                                             lead_s=self.settings.lead_s),
                                 job_id_for=partial(fire_job_id, gana.id), now=now)
            if claimed is not None:
                self.submit(claimed, ganas)

    def submit(self, fire: Fire, ganas: dict[str, GanaDef]) -> None:
        gana = ganas.get(fire.gana_id)
        log = logger.bind(job=fire.job_id)
        if gana is None:
            log.warning("Gana {} is no longer defined; its fire is closed unrun", fire.gana_id)
            finish_fire(self.store, fire, None, failed="gana removed")
            return
        job = gana_job(gana, job_id=fire.job_id, deadline=fire.slot,
                       max_new_tokens_cap=self.settings.max_new_tokens_cap)
        assert self.tracker is not None
        if self.tracker.add(job, {"gana_id": gana.id, "slot": fire.slot}):
            log.info("fired Gana {} (slot {:.3f})", gana.id, fire.slot)

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
