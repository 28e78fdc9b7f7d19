"""Embedding throughput, measured on a real pool (processes, sockets, model).

Why a real pool: the number users care about is what a consumer gets through the
socket with the default two workers, envelope and queueing included -- not the bare
ONNX session. The session's own single-thread rate is measured beside it, so the
pool's overhead and its scaling over two workers are visible.

The pool runs as a private side pool (``--private``: it does not publish
``run/embed.endpoint``) on its own socket, so a running runtime is not disturbed.
Results go to ``bench/results/embed-pool-throughput.json``.
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from uniun.models.store import ModelStore
from uniun.runtime.paths import models_dir

_WORDS = ("note meeting project embedding model runtime queue worker chat deck card "
          "agent schedule token cache memory river mountain market weather garden "
          "friday budget design review release summary question answer idea travel "
          "music history science kitchen library window morning evening").split()


def corpus(count: int, *, seed: int = 7) -> list[str]:
    """``count`` note-like sentences of 8-40 words (deterministic for a seed)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 40))) + "."
            for _ in range(count)]


def run(results_dir: Path | None = None, *, workers: int = 2, requests: int = 48,
        texts_per_request: int = 8, latency_samples: int = 20,
        start_timeout_s: float = 300.0) -> dict[str, Any]:
    """Measure and write ``<results_dir>/embed-pool-throughput.json``; returns the same dict.

    ``texts_per_request`` texts per ``embed`` request, ``requests`` of them sent at once
    (the queue bound is set so none is refused): throughput = texts / wall time from the
    first send to the last reply. Latency: one one-text request at a time, idle pool.
    """
    from uniun.models.embedding import EmbeddingSession
    from uniun.protocol.embed_client import EmbedClient, EmbedUnavailable

    results_dir = Path(results_dir) if results_dir is not None else Path("bench/results")
    texts = corpus(requests * texts_per_request)
    batches = [texts[i::requests] for i in range(requests)]
    with tempfile.TemporaryDirectory(prefix="uniun-eb-") as tmp:
        endpoint = f"ipc://{tmp}/embed.sock"
        pool = subprocess.Popen(
            [sys.executable, "-m", "uniun.runtime.embed_main", "--private", "--endpoint",
             endpoint, "--workers", str(workers), "--queue-bound", str(requests),
             "--log-level", "WARNING"], stdin=subprocess.DEVNULL)
        try:
            client = _connect(EmbedClient, EmbedUnavailable, endpoint, pool, start_timeout_s)
            with client:
                # Warm up: every worker loaded and has run once.
                client.wait([client.submit(texts[i:i + 4]) for i in range(workers * 2)],
                            timeout=start_timeout_s)
                start = time.perf_counter()
                ids = [client.submit(batch) for batch in batches]
                replies = client.wait(ids, timeout=start_timeout_s)
                wall = time.perf_counter() - start
                bad = [r for r in replies.values() if not isinstance(r, np.ndarray)]
                if bad:
                    raise RuntimeError(f"{len(bad)} bench requests failed: {bad[0]}")
                latencies = []
                for text in texts[:latency_samples]:
                    t0 = time.perf_counter()
                    client.embed([text])
                    latencies.append(time.perf_counter() - t0)
        finally:
            pool.terminate()
            pool.wait(timeout=30)
    session = EmbeddingSession.open(ModelStore(models_dir()), threads=1)
    session.embed(texts[:8])
    t0 = time.perf_counter()
    for batch in batches:  # the same requests, one after another, in this process
        session.embed(batch)
    single = len(texts) / (time.perf_counter() - t0)
    result = {
        "benchmark": "embed",
        "model_id": session.model_id,
        "dim": session.dim,
        "workers": workers,
        "requests": requests,
        "texts_per_request": texts_per_request,
        "texts": len(texts),
        "pool_texts_per_s": round(len(texts) / wall, 1),
        "pool_wall_s": round(wall, 3),
        "one_text_latency_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "session_1thread_texts_per_s": round(single, 1),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "machine": platform.machine(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "embed-pool-throughput.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _connect(client_cls: Any, unavailable: type[Exception], endpoint: str,
             pool: subprocess.Popen[bytes], timeout_s: float) -> Any:
    """A client once the side pool answers ``ping`` (it may be converting the model)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if pool.poll() is not None:
            raise RuntimeError(f"the bench pool exited with code {pool.returncode}")
        client = None
        try:
            client = client_cls(endpoint, timeout=timeout_s)
            client.ping(timeout=5)
            return client
        except unavailable:
            if client is not None:
                client.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]) if len(sys.argv) > 1 else None), indent=2))
