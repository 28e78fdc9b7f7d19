"""Process entries of the producers: config in, a running ``ProducerActor`` out.

``python -m uniun.runtime.process extract|nataraj|gana|background-gana --config FILE``
(the supervisor spawns these when ``[producers]`` enables them) ends up here. This module
is the only place that turns :class:`~uniun.runtime.config.RuntimeConfig` into the
producers' settings, so the logic classes stay free of config and process concerns.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniun.actors.producers.actor import ProducerActor, ProducerLogic
from uniun.actors.producers.deck import WaterMarks
from uniun.actors.producers.extract import ExtractProducer, ExtractSettings
from uniun.actors.producers.gana_cron import GanaCron, GanaSettings
from uniun.actors.producers.lifecycle import LifecycleWatch
from uniun.actors.producers.nataraj import NatarajProducer, NatarajSettings
from uniun.actors.producers.results import ResultsStore
from uniun.actors.producers.samples import ensure_samples
from uniun.models.store import ModelStore
from uniun.protocol.client import Client
from uniun.protocol.embed_client import EmbedClient
from uniun.runtime import process
from uniun.runtime.config import RuntimeConfig
from uniun.runtime.paths import models_dir
from uniun.runtime.security import client_curve

CLIENT_TIMEOUT_S = 10.0  # a reply from the scheduler
STATUS_TIMEOUT_S = 3.0  # the lifecycle poll must not hold a producer up for long


def notes_dir(config: RuntimeConfig) -> Path:
    raw = config.producers.notes_dir
    return Path(raw).expanduser() if raw else config.home / "notes"


def ganas_file(config: RuntimeConfig) -> Path:
    raw = config.producers.ganas_file
    return Path(raw).expanduser() if raw else config.home / "ganas.toml"


def _client(config: RuntimeConfig, **kwargs: Any) -> Client:
    return Client(config.front.endpoint, timeout=CLIENT_TIMEOUT_S,
                  curve=client_curve(config.front.endpoint), **kwargs)


class PoolEmbedder:
    """The embedding pool as a function texts -> ``[n, dim]`` vectors.

    The connection is made on first use and dropped after any failure (pool down,
    ``queue_full``, timeout), so the extract producer's retry starts clean.
    """

    def __init__(self, endpoint: str, timeout: float = 60.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._client: Any = None

    def __call__(self, texts: list[str]) -> Any:
        if self._client is None:
            self._client = EmbedClient(self.endpoint, timeout=self.timeout,
                                       curve=client_curve(self.endpoint))
        try:
            return self._client.embed(texts)
        except Exception:
            self._client.close()
            self._client = None
            raise


def _embedder(config: RuntimeConfig) -> PoolEmbedder | None:
    """The embedding pool, or None when it is not enabled (notes are then not embedded)."""
    return PoolEmbedder(config.embed.endpoint) if config.embed.enabled else None


def extract_logic(config: RuntimeConfig) -> ProducerLogic:
    p = config.producers
    if p.samples:
        ensure_samples(notes_dir(config), ganas_file(config))
    settings = ExtractSettings(
        notes_dir=notes_dir(config), scan_interval_s=p.scan_interval_s,
        backfill_per_s=p.backfill_per_s, max_in_flight=p.extract_in_flight,
        max_new_tokens=min(p.extract_max_new_tokens, config.limits.max_new_tokens_cap),
        model_id=p.extract_model or None, constrained=p.extract_format)
    store = ResultsStore(config.results_path)
    return ExtractProducer.with_tracker(settings, store, _client(config),
                                        embed=_embedder(config), now=time.time())


def nataraj_logic(config: RuntimeConfig) -> ProducerLogic:
    p = config.producers
    settings = NatarajSettings(
        marks=WaterMarks(p.deck_low, p.deck_high), check_interval_s=p.check_interval_s,
        max_new_tokens=min(p.card_max_new_tokens, config.limits.max_new_tokens_cap),
        model_id=p.nataraj_model or None,
        prompt_style=_prompt_style(p.nataraj_prompt, p.nataraj_model or config.models.chat_model,
                                   config))
    store = ResultsStore(config.results_path)
    return NatarajProducer.with_tracker(settings, store, _client(config), now=time.time())


def _prompt_style(setting: str, model_id: str, config: RuntimeConfig) -> str:
    """``chat`` or ``completion``; ``auto`` asks the model store whether ``model_id`` is a
    base model (no chat template; docs/models.md)."""
    if setting in ("chat", "completion"):
        return setting
    if setting != "auto":
        raise ValueError(f"producers.nataraj_prompt must be auto, chat or completion "
                         f"(got {setting!r})")
    from uniun.models.convert.recipes import is_base_model
    from uniun.models.store import ModelStore

    return "completion" if is_base_model(model_id, ModelStore(models_dir())) else "chat"


def gana_logic(config: RuntimeConfig) -> ProducerLogic:
    p = config.producers
    if p.samples:
        ensure_samples(notes_dir(config), ganas_file(config))
    settings = GanaSettings(ganas_file=ganas_file(config), lead_s=p.gana_lead_s,
                            check_interval_s=p.check_interval_s,
                            max_new_tokens_cap=config.limits.max_new_tokens_cap)
    store = ResultsStore(config.results_path)
    client = _client(config)
    lifecycle = LifecycleWatch(lambda: client.status(timeout=STATUS_TIMEOUT_S),
                               p.lifecycle_poll_s)
    return GanaCron.with_tracker(settings, store, client, lifecycle, now=time.time())


def background_gana_logic(config: RuntimeConfig) -> ProducerLogic:
    # Imported here: the other producer processes need not pay for its model code.
    from uniun.actors.producers.background_gana import (
        BackgroundGana,
        BackgroundSettings,
        SessionCache,
    )

    p = config.producers
    settings = BackgroundSettings(
        ganas_file=ganas_file(config), default_model=config.models.chat_model,
        lead_s=p.gana_lead_s, check_interval_s=p.check_interval_s,
        lease_s=p.background_lease_s, threads=config.budget().background_threads,
        max_new_tokens_cap=config.limits.max_new_tokens_cap)
    store = ResultsStore(config.results_path)
    # Short reconnect: an unreachable scheduler must not freeze background firing.
    client = _client(config, reconnect_timeout=STATUS_TIMEOUT_S)
    lifecycle = LifecycleWatch(lambda: client.status(timeout=STATUS_TIMEOUT_S),
                               p.lifecycle_poll_s)
    from uniun.protocol.device_state import YieldGate, device_endpoint

    sessions = SessionCache(ModelStore(models_dir()), config.budget().background_threads)
    gate = YieldGate(device_endpoint() if config.device.yield_signal else None)
    return BackgroundGana(settings, store, lifecycle, sessions,
                          stopping=process.STOPPING.is_set, now=time.time(),
                          interactive=lambda: gate.interactive)


FINISH_TIMEOUT_S = 10.0  # how long a dead producer actor may take to close its logic


def run_producer(make_logic: Callable[[], ProducerLogic], *, pump_s: float = 0.2) -> int:
    """Run one producer actor until SIGTERM (exit 0) or until it fails (exit 1)."""
    failed, finished = threading.Event(), threading.Event()
    ref = ProducerActor.start(make_logic, pump_s=pump_s, failed=failed, finished=finished)
    process.on_stop(lambda: ref.stop(block=False))
    try:
        while ref.is_alive():
            time.sleep(0.2)
    except KeyboardInterrupt:
        ref.stop(block=True, timeout=10)
    # Dead is not yet done: on_failure may still be closing the logic and setting
    # ``failed``. Without this wait a failed producer often exited 0.
    finished.wait(timeout=FINISH_TIMEOUT_S)
    return 1 if failed.is_set() else 0


def extract_main(config: RuntimeConfig) -> int:
    return run_producer(lambda: extract_logic(config))


def nataraj_main(config: RuntimeConfig) -> int:
    return run_producer(lambda: nataraj_logic(config))


def gana_main(config: RuntimeConfig) -> int:
    return run_producer(lambda: gana_logic(config))


def background_gana_main(config: RuntimeConfig) -> int:
    return run_producer(lambda: background_gana_logic(config))
