"""The scheduler's publisher of the device-state signal (``protocol/device_state.py``).

The host calls :meth:`DevicePublisher.set` after every input with the policy's pure
``interactive()`` answer; a change is published at once, and a thread re-publishes the
current state every ``REPUBLISH_S`` so late joiners and listeners that missed a message
catch up. The thread owns the PUB socket (ZeroMQ's one-thread rule); ``set`` only takes a
lock and wakes it. Nothing here reads the load of any listener: the signal is one-way.
"""

from __future__ import annotations

import contextlib
import threading

import zmq
from loguru import logger

from uniun.protocol.device_state import REPUBLISH_S, DeviceState, encode_state

__all__ = ["DevicePublisher"]


class DevicePublisher:
    """See the module docstring. ``start()`` binds; ``close()`` stops the thread."""

    def __init__(self, endpoint: str, ctx: zmq.Context, *,
                 republish_s: float = REPUBLISH_S) -> None:
        self.endpoint = endpoint
        self._ctx = ctx
        self._republish_s = republish_s
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._state = DeviceState(False, 0)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="device-pub", daemon=True)

    @property
    def state(self) -> DeviceState:
        with self._lock:
            return self._state

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(10.0)
        if self._error is not None:
            raise self._error

    def set(self, interactive: bool) -> None:
        """The current answer of ``policy.interactive()`` (cheap when unchanged)."""
        with self._lock:
            if interactive == self._state.interactive:
                return
            self._state = DeviceState(interactive, self._state.seq + 1)
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(2.0)

    def _run(self) -> None:
        try:
            sock = self._ctx.socket(zmq.PUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 16)
            sock.bind(self.endpoint)
        except BaseException as err:  # noqa: BLE001 - handed to start()'s caller
            self._error = err
            self._ready.set()
            return
        self._ready.set()
        logger.info("device state published at {}", self.endpoint)
        try:
            while not self._stop.is_set():
                state = self.state
                # No listener keeps up: the next re-publish carries the truth.
                with contextlib.suppress(zmq.ZMQError):
                    sock.send(encode_state(state), zmq.NOBLOCK)
                self._wake.wait(self._republish_s)
                self._wake.clear()
        finally:
            sock.close(0)
