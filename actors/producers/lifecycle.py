"""How producers learn the app's lifecycle: they poll the scheduler's ``status``.

The scheduler is the one place that receives ``lifecycle foreground|background``
(docs/protocol.md), and its ``status`` reply carries ``lifecycle``. Polling (default every
second) keeps the producers free of any extra socket or subscription protocol; a
handover therefore lags a flip by at most one poll, which is harmless because the
results database settles who fires each Gana slot (``runtime.results_fires``).

While the scheduler cannot be reached the last known state is kept and reported as
stale, so each user decides: gana-cron cannot submit anyway, the background-Gana process
keeps firing if the app was last seen backgrounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loguru import logger

FOREGROUND = "foreground"
BACKGROUND = "background"


class LifecycleWatch:
    """Cached ``status.lifecycle``; ``status`` is the client's status call."""

    def __init__(self, status: Callable[[], dict[str, Any]], poll_s: float = 1.0,
                 *, initial: str | None = None) -> None:
        self._status = status
        self.poll_s = poll_s
        self.state: str | None = initial
        self.fresh = False  # whether the last poll reached the scheduler
        self._next_poll = float("-inf")
        # The power governor's mode from the same status (docs/device.md, "Power and
        # heat"); None: an older scheduler, or not yet known.
        self.power_mode: str | None = None

    def current(self, now: float, *, force: bool = False) -> str | None:
        """The lifecycle, polling the scheduler if ``poll_s`` passed (or ``force``)."""
        if force or now >= self._next_poll:
            self._next_poll = now + self.poll_s
            try:
                status = self._status()
                state = status.get("lifecycle")
            except Exception as err:  # noqa: BLE001 - unreachable, timed out, refused: keep what we knew
                if self.fresh:
                    logger.warning("cannot read the lifecycle from the scheduler ({}); "
                                   "keeping {!r}", err, self.state)
                self.fresh = False
                return self.state
            self.power_mode = (status.get("power") or {}).get("mode")
            if state in (FOREGROUND, BACKGROUND):
                if state != self.state:
                    logger.info("lifecycle is {}", state)
                self.state = state
                self.fresh = True
        return self.state
