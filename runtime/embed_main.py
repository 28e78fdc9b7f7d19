"""Entry points of the embedding pool process.

- ``embed`` in the process registry (``python -m uniun.runtime.process embed --config
  FILE``, what the supervisor spawns): :func:`main`, settings from ``[embed]``.
- ``python -m uniun.runtime.embed_main``: a pool on its own, in the foreground, for
  tests, benchmarks and debugging (``--private`` keeps it from publishing
  ``run/embed.endpoint``, so it cannot capture clients of the runtime's own pool).
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from uniun.actors.embedding.freezer import Freezer
from uniun.actors.embedding.pool import EmbedPool, PoolSettings
from uniun.actors.embedding.worker import DEFAULT_MICRO_BATCH
from uniun.models.convert.embedding import MODEL_ID
from uniun.models.store import ModelStore
from uniun.protocol.device_state import YieldGate, device_endpoint
from uniun.protocol.endpoints import EMBED, default_endpoint
from uniun.runtime import process
from uniun.runtime.config import RuntimeConfig
from uniun.runtime.embed_worker_main import ARGV as WORKER_ARGV
from uniun.runtime.logging_setup import configure_logging
from uniun.runtime.paths import logs_dir, models_dir, run_dir
from uniun.runtime.security import server_security

HUNG_AFTER_S = 10.0  # a loop that has not ticked for this long is hung, s


def _places() -> dict[str, Any]:
    """The folders and worker command every pool of this runtime uses."""
    return {"store": ModelStore(models_dir()), "run_dir": run_dir(), "logs_dir": logs_dir(),
            "worker_argv": WORKER_ARGV}


def settings_from_config(config: RuntimeConfig) -> PoolSettings:
    """``[embed]``, ``models.embed_model`` and ``logging.level`` of a ``RuntimeConfig``."""
    return PoolSettings(endpoint=config.embed.endpoint, workers=config.embed.workers,
                        queue_bound=config.embed.queue_bound,
                        client_queue_bound=config.embed.client_queue_bound,
                        micro_batch=config.embed.micro_batch,
                        model_id=config.models.embed_model,
                        threads=config.budget().embed_threads,
                        device_state=device_endpoint() if config.device.yield_signal else "",
                        log_level=config.logging.level.upper(), **_places())


def main(config: RuntimeConfig) -> int:
    """The ``embed`` process: serve until the supervisor's SIGTERM."""
    stop = threading.Event()
    process.on_stop(stop.set)
    settings = settings_from_config(config)
    if config.metrics.enabled:
        from uniun.actors.metrics import MetricSink

        settings = dataclasses.replace(settings, observe=MetricSink().apply)
    security = server_security(settings.endpoint or default_endpoint(EMBED), "embedding pool")
    settings = dataclasses.replace(settings, front_setup=security,
                                   front_teardown=security.stop if security else None)
    pool = EmbedPool(settings)
    # Beat only while the loop turns (it ticks every 0.1 s): a hung pool gets restarted.
    process.set_health_check(lambda: time.monotonic() - pool.last_tick < HUNG_AFTER_S)
    freezer = None
    if config.device.freeze_embed_workers and settings.device_state:
        freezer = Freezer(YieldGate(settings.device_state),
                          lambda: [w.pid for w in pool.workers if w.pid is not None])
        process.on_stop(freezer.stop_soon)  # the shutdown meets running workers
    try:
        return pool.run(stop)
    finally:
        if freezer is not None:
            freezer.close()
        if security is not None:  # also when the pool never reached its shutdown
            security.stop()


def cli(argv: Sequence[str] | None = None) -> int:
    """``python -m uniun.runtime.embed_main``: run a pool in the foreground."""
    parser = argparse.ArgumentParser(prog="python -m uniun.runtime.embed_main",
                                     description="Run the embedding pool in the foreground.")
    parser.add_argument("--endpoint", default=None,
                        help="bind here (default ipc://$UNIUN_HOME/run/embed.sock)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--queue-bound", type=int, default=64)
    parser.add_argument("--client-queue-bound", type=int, default=16,
                        help="requests one connection may have waiting (0 = no cap)")
    parser.add_argument("--micro-batch", type=int, default=DEFAULT_MICRO_BATCH,
                        help="texts per ONNX run of a request")
    parser.add_argument("--model", default=MODEL_ID)
    parser.add_argument("--private", action="store_true",
                        help="do not write run/embed.endpoint (a side pool)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    configure_logging("embed", log_file=logs_dir() / "embed.log", level=args.log_level,
                      stderr=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    settings = PoolSettings(endpoint=args.endpoint or default_endpoint(EMBED),
                            workers=args.workers, queue_bound=args.queue_bound,
                            client_queue_bound=args.client_queue_bound,
                            micro_batch=args.micro_batch,
                            model_id=args.model, log_level=args.log_level,
                            publish_endpoint=not args.private, **_places())
    return EmbedPool(settings).run(stop)


if __name__ == "__main__":
    sys.exit(cli())
