"""The background-Gana process: fires due Ganas with its own model while the app is away.

The seed's ``gana_workmanager`` (§8): when the app is backgrounded there is no chat, no
page in front and nothing for the scheduler to arbitrate, so Ganas run in a separate
process with their own :class:`~uniun.models.session.DecoderSession`, no scheduler
involved, and write their runs to the same results database. The scheduler meanwhile
keeps serving what was already queued, under its 25 % governor.

Theory of operation:

- Lifecycle comes from polling the scheduler's ``status`` (``actors.lifecycle``). Only
  while it is ``background`` does this process claim and run fires; if the scheduler
  cannot be reached, the last known state holds.
- Firing uses the same schedule (``gana_schedule.due_slot``) and the same claim
  transaction as gana-cron (``results_fires.claim_fire``), so at a handover each slot is
  fired by exactly one side. Claims carry a lease, renewed while generating; if this
  process dies mid-run the claim is adopted after the lease by whichever side is active
  (this process after a restart, or gana-cron once back in foreground).
- A run in progress when the app returns to foreground finishes (bounded by its
  ``max_new_tokens``); no new fire starts. On SIGTERM the run stops at the next token and
  its lease is released at once, so the fire is re-run elsewhere, not lost.
- While the scheduler says interactive work is in flight (``protocol/device_state.py``,
  docs/device.md) no new token step starts: the run waits and goes on when it ends.
- The model is loaded on the first background fire and unloaded once back in
  foreground, so the process costs no model memory while the scheduler's runner works.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from loguru import logger

from uniun.actors.producers.gana_cron import GanaFile
from uniun.actors.producers.gana_schedule import (
    GanaDef,
    due_slot,
    fire_job_id,
    gana_completion_prompt,
    gana_messages,
)
from uniun.actors.producers.lifecycle import BACKGROUND, LifecycleWatch
from uniun.actors.producers.results import ResultsStore
from uniun.actors.producers.results_fires import (
    OWNER_BACKGROUND,
    Fire,
    adopt_expired,
    claim_fire,
    finish_fire,
    renew_lease,
)
from uniun.models.convert.recipes import ensure_model
from uniun.models.store import ModelStore

NAME = "background-gana"
RUNNER = "background"
# Power modes in which this process, which computes outside the runner, fires nothing:
# the scheduler holds its own background work then too (docs/device.md). Fires have no
# deadline field, so a low battery holds them like any other background work.
HELD_BY_POWER = frozenset({"paused", "deadline_only"})


@dataclass(frozen=True)
class BackgroundSettings:
    ganas_file: Path
    default_model: str
    lead_s: float = 60.0  # same as gana-cron, so both sides agree on when a slot is due
    check_interval_s: float = 1.0
    lease_s: float = 30.0  # a claim's lease, renewed every lease_s / 3 while generating
    threads: int = 1  # ONNX Runtime threads: stays out of the runner's way
    max_new_tokens_cap: int | None = None


class SessionCache:
    """One loaded decoder at a time, by model id (loading takes seconds: keep it)."""

    def __init__(self, store: ModelStore, threads: int = 1,
                 loader: Callable[[ModelStore, str, int], Any] | None = None) -> None:
        self.store = store
        self.threads = threads
        self._loader = loader or _load_session
        self.model_id: str | None = None
        self.session: Any = None

    def get(self, model_id: str) -> Any:
        if self.model_id != model_id:
            self.unload()
            self.session = self._loader(self.store, model_id, self.threads)
            self.model_id = model_id
        return self.session

    def unload(self) -> None:
        if self.session is not None:
            logger.info("unloading {}", self.model_id)
            self.session.unload()
        self.session, self.model_id = None, None


def _load_session(store: ModelStore, model_id: str, threads: int) -> Any:
    # Imported here: onnxruntime costs memory, and this process loads a model only while
    # the app is in the background.
    from uniun.models.session import DecoderSession

    return DecoderSession.load(ensure_model(model_id, store), threads=threads,
                               model_id=model_id, spinning=False)


class BackgroundGana:
    name = NAME

    def __init__(self, settings: BackgroundSettings, store: ResultsStore,
                 lifecycle: LifecycleWatch, sessions: SessionCache, *,
                 stopping: Callable[[], bool] = lambda: False, now: float = 0.0,
                 interactive: Callable[[], bool] = lambda: False) -> None:
        self.settings = settings
        self.interactive = interactive  # YieldGate.interactive of the device state
        self.store = store
        self.lifecycle = lifecycle
        self.sessions = sessions
        self.stopping = stopping
        self.file = GanaFile(settings.ganas_file)
        self._next_check = now
        self.tracker = None  # no scheduler jobs: ProducerActor just sleeps between ticks

    def step(self, now: float) -> None:
        if now < self._next_check:
            return
        self._next_check = now + self.settings.check_interval_s
        if self.lifecycle.current(now) != BACKGROUND:
            self.sessions.unload()
            return
        if self.lifecycle.power_mode in HELD_BY_POWER:
            return  # too hot, or a low battery: fires wait (the scheduler's own rule)
        ganas = self.file.load()
        lease = self.settings.lease_s
        for fire in adopt_expired(self.store, OWNER_BACKGROUND, lease_s=lease, now=now):
            self.run(fire, ganas)
        for gana in ganas.values():
            if self.stopping():
                return
            claimed = claim_fire(self.store, gana.id, owner=OWNER_BACKGROUND,
                                 due=partial(due_slot, every_s=gana.every_s, now=time.time(),
                                             lead_s=self.settings.lead_s),
                                 job_id_for=partial(fire_job_id, gana.id), lease_s=lease)
            if claimed is not None:
                self.run(claimed, ganas)

    def run(self, fire: Fire, ganas: dict[str, GanaDef]) -> None:
        """Generate one fire with our own session and record it (or release it)."""
        log = logger.bind(job=fire.job_id)
        gana = ganas.get(fire.gana_id)
        if gana is None:
            finish_fire(self.store, fire, None, failed="gana removed")
            return
        model_id = gana.model_id or self.settings.default_model
        max_new = gana.max_new_tokens
        if self.settings.max_new_tokens_cap is not None:
            max_new = min(max_new, self.settings.max_new_tokens_cap)
        started = time.time()
        try:
            session = self.sessions.get(model_id)
            text_in = ({"prompt": gana_completion_prompt(gana)} if gana.style == "completion"
                       else {"messages": gana_messages(gana)})
            gen = session.start(**text_in, max_new_tokens=max_new, job_id=fire.job_id,
                                tools=gana.tools, tool_choice=gana.tool_choice)
        except Exception as err:  # noqa: BLE001 - unknown model, prompt too long: a recorded failure
            log.error("cannot run Gana {} on {}: {}", gana.id, model_id, err)
            finish_fire(self.store, fire, None, failed=f"{type(err).__name__}: {err}")
            return
        log.info("running Gana {} in the background on {}", gana.id, model_id)
        ttft: float | None = None
        renew_at = started + self.settings.lease_s / 3
        waited = 0.0
        while not gen.finished:
            if self.stopping():
                log.info("stopping mid-run; releasing the fire for adoption")
                renew_lease(self.store, fire.job_id, -1.0)
                return
            waited += self._yield()
            session.step(gen)
            if ttft is None:
                ttft = time.time() - started
            if time.time() >= renew_at:
                renew_lease(self.store, fire.job_id, self.settings.lease_s)
                renew_at = time.time() + self.settings.lease_s / 3
        total = time.time() - started
        finish_fire(self.store, fire, {
            "runner": RUNNER, "model_id": model_id, "prompt": gana.prompt, "text": gen.text,
            "finish_reason": gen.finish_reason, "completion_tokens": len(gen.generated_ids),
            "queued_s": max(0.0, started - fire.slot), "ttft_s": ttft, "total_s": total,
            "preemptions": 0, "started_at": started})
        log.info("Gana {} done in the background: {} tokens in {:.2f}s ({}; {:.2f}s of it "
                 "yielding to interactive work)", gana.id, len(gen.generated_ids), total,
                 gen.finish_reason, waited)

    def _yield(self) -> float:
        """Wait while interactive work is in flight (the step in progress was the last)."""
        if not self.interactive():
            return 0.0
        t0 = time.monotonic()
        while self.interactive() and not self.stopping():
            time.sleep(0.02)
        return time.monotonic() - t0

    def close(self) -> None:
        self.sessions.unload()
