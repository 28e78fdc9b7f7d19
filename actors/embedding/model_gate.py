"""Whether the pool's embedding model is ready, and making it so without blocking.

The pool binds its socket first and makes its model ready in a thread (``ensure_model``
converts it from the wheel on a first run), so requests queue meanwhile instead of
meeting a closed socket. If the model cannot be made, the gate holds the reason (every
queued and new request is answered ``unknown_model`` with it) and tries again after
``MODEL_RETRY_S``. The thread only assigns fields; the pool's loop reads them.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from loguru import logger

from uniun.models.convert.recipes import ensure_model
from uniun.models.store import ModelStore
from uniun.protocol.errors import ErrorCode, ProtocolError

__all__ = ["MODEL_RETRY_S", "ModelGate"]

MODEL_RETRY_S = 30.0  # a model that could not be made is tried again after this, s


class ModelGate:
    """``folder`` once the model is ready; ``error`` while it cannot be made."""

    def __init__(self, store: ModelStore, model_id: str) -> None:
        self.store = store
        self.model_id = model_id
        self.folder: Path | None = None
        self.error: str | None = None
        self._thread: threading.Thread | None = None
        self._next_try = 0.0

    def tick(self, now: float) -> None:
        """From the pool's loop: start making the model ready if it is time to."""
        if self.folder is not None or self._thread is not None or now < self._next_try:
            return
        self._thread = threading.Thread(target=self._prepare, daemon=True, name="embed-model")
        self._thread.start()

    def failed(self, reason: str, now: float) -> None:
        """The workers could not load the folder: forget it, retry later."""
        self.folder, self.error, self._next_try = None, reason, now + MODEL_RETRY_S

    def unavailable(self) -> ProtocolError:
        return ProtocolError(ErrorCode.UNKNOWN_MODEL,
                             f"embedding model {self.model_id} is not available "
                             f"({self.error}); run `uniun-runtime models pull "
                             f"{self.model_id}`", retryable=True)

    def _prepare(self) -> None:
        try:
            self.folder = ensure_model(self.model_id, self.store)
            self.error = None
        except Exception as exc:  # noqa: BLE001 - any failure is reported to clients
            self._next_try = time.monotonic() + MODEL_RETRY_S
            self.error = f"{type(exc).__name__}: {exc}"
            logger.error("embedding model {} is not available: {}", self.model_id, exc)
        finally:
            self._thread = None
