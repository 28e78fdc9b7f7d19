"""Embedding requests during the chaos run, in a thread with its own pool client.

Embedding is a pure function of the texts, so the check is simple: every request is
answered, and with the vectors the fault-free calibration got for the same texts. A
request that meets a dead pool (``EmbedUnavailable``, a timeout, ``queue_full``) is
tried again, as a producer would, until ``give_up_s`` has passed; only then is it
``gave_up``. ``retries`` counts the tries beyond the first.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from uniun.protocol.client import ClientError, Timeout
from uniun.protocol.embed_client import EmbedClient, EmbedUnavailable

__all__ = ["EmbedLoad", "EmbedStats"]

TEXTS = ("the pear tree in the garden", "a lighthouse and its keeper", "trains at night",
         "three facts about the moon", "clocks that run backwards", "basil and tomatoes")


@dataclass
class EmbedStats:
    requests: int = 0
    answered: int = 0
    wrong: int = 0  # vectors unlike the fault-free ones
    gave_up: int = 0
    retries: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # kind of failure -> count

    def to_map(self) -> dict[str, object]:
        return {"requests": self.requests, "answered": self.answered, "wrong": self.wrong,
                "gave_up": self.gave_up, "retries": self.retries, "errors": dict(self.errors)}


class EmbedLoad(threading.Thread):
    """See the module docstring. :meth:`calibrate` first, then ``start()``/``finish()``."""

    def __init__(self, endpoint: str, rng: random.Random, *, every_s: float = 0.5,
                 give_up_s: float = 60.0) -> None:
        super().__init__(name="chaos-embeds", daemon=True)
        self.endpoint, self.rng = endpoint, random.Random(rng.random())
        self.every_s, self.give_up_s = every_s, give_up_s
        self.stats = EmbedStats()
        self._refs: dict[str, np.ndarray] = {}
        self._halt = threading.Event()

    def calibrate(self, timeout_s: float = 120.0) -> None:
        """The fault-free vectors of every text (waits for a pool to answer)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with EmbedClient(self.endpoint, timeout=30.0, connect_timeout=5.0) as client:
                    rows = client.embed(list(TEXTS))
                break
            except (EmbedUnavailable, Timeout, ClientError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self._refs = {t: rows[i] for i, t in enumerate(TEXTS)}

    def run(self) -> None:
        client: EmbedClient | None = None
        while not self._halt.wait(self.every_s):
            texts = self.rng.sample(TEXTS, self.rng.randint(1, 3))
            self.stats.requests += 1
            deadline = time.monotonic() + self.give_up_s
            while True:
                try:
                    if client is None:
                        client = EmbedClient(self.endpoint, timeout=20.0, connect_timeout=5.0)
                    rows = client.embed(texts)
                    break
                except (EmbedUnavailable, Timeout, ClientError) as err:
                    name = getattr(err, "code", None) or type(err).__name__
                    self.stats.errors[name] = self.stats.errors.get(name, 0) + 1
                    if client is not None:
                        client.close()
                        client = None
                    if self._halt.is_set():  # the run ended meanwhile: not a verdict
                        self.stats.requests -= 1
                        rows = None
                        break
                    if time.monotonic() > deadline:
                        self.stats.gave_up += 1
                        rows = None
                        break
                    self.stats.retries += 1
                    time.sleep(0.2)
            if rows is None:
                continue
            self.stats.answered += 1
            if not all(np.allclose(rows[i], self._refs[t], atol=1e-4)
                       for i, t in enumerate(texts)):
                self.stats.wrong += 1
        if client is not None:
            client.close()

    def finish(self, timeout_s: float = 90.0) -> EmbedStats:
        self._halt.set()
        self.join(timeout_s)
        return self.stats
