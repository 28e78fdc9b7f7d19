"""Stop the pool's workers outright while interactive work is in flight (docs/device.md).

The workers check the yield signal before each micro-batch, so a chat waits for at most
the run each of them has in flight. That run still shares the cores with the chat's
prefill. So the broker, which runs at the pool's (normal) priority and hears the signal
at once on a thread of its own, also sends its workers ``SIGSTOP`` when the signal goes
on and ``SIGCONT`` when it goes off: the run in flight stops where it is and resumes
after, unchanged (a stopped process keeps its memory and sockets; a request it holds
waits, as it would at a micro-batch boundary).

Safety: a scheduler that dies stops publishing, and the gate reads a silent signal as
"free" after 3 s, so the workers are continued; when the pool is told to stop, the
freezer stops freezing and continues every worker it stopped, so the pool's shutdown
meets running workers (a stopped process would not act on ``SIGTERM``).

Off by default (``[device] freeze_embed_workers``): a stopped worker cannot report that
it paused, so the pool's yield counters see a frozen stretch as one long micro-batch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable

from loguru import logger

from uniun.protocol.device_state import YieldGate

__all__ = ["Freezer"]


class Freezer:
    """A thread that stops ``pids()`` while ``gate`` says interactive, continues after."""

    def __init__(self, gate: YieldGate, pids: Callable[[], list[int]]) -> None:
        self._gate = gate
        self._pids = pids
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.frozen: set[int] = set()
        self.freezes = 0  # times the workers were stopped (status)
        self._thread = threading.Thread(target=self._loop, name="embed-freezer", daemon=True)
        self._thread.start()

    def stop_soon(self) -> None:
        """Stop freezing; the thread continues every stopped worker as it ends (safe to
        call from a signal handler: it only sets an event)."""
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self._thaw()
        self._gate.close()

    def _loop(self) -> None:
        state = False
        while not self._stop.is_set():
            state = self._gate.wait_change(state, 0.5)
            if self._stop.is_set():
                break
            if state:
                self._freeze()  # also a worker started meanwhile
            else:
                self._thaw()
        self._thaw()

    def _freeze(self) -> None:
        with self._lock:
            fresh = [pid for pid in self._pids() if pid not in self.frozen]
            if fresh and not self.frozen:
                self.freezes += 1
            for pid in fresh:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)
                    self.frozen.add(pid)

    def _thaw(self) -> None:
        with self._lock:
            for pid in self.frozen:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGCONT)
            if self.frozen:
                logger.debug("continued {} embedding workers", len(self.frozen))
            self.frozen.clear()
