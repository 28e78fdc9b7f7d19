"""CPU and memory of the runtime's processes, read from ``/proc`` (Linux).

The scheduler puts these into its ``status`` reply (``process_info``), so ``top`` shows
them over the front socket like everything else. CPU % is measured between two calls
(``top`` asks several times a second), the first call of a pid gives its average since
it started. Restart counts come from the supervisor's state file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ProcessSampler", "read_proc"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def read_proc(pid: int) -> tuple[float, int, float] | None:
    """(CPU seconds used, RSS bytes, seconds since the process started), or None if the
    process is gone or unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        statm = Path(f"/proc/{pid}/statm").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
    try:
        cpu = (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime
        age = max(1e-6, uptime - int(fields[19]) / _TICKS)  # starttime
        rss = int(statm.split()[1]) * _PAGE
    except (ValueError, IndexError):
        return None
    return cpu, rss, age


class ProcessSampler:
    """``sample(pids, restarts)`` -> name -> {pid, cpu_percent, rss_bytes, restarts}.

    CPU % is over the interval since the previous sample of that pid, once it is at
    least :attr:`MIN_INTERVAL_S` long (a burst of calls reuses the last figure).
    """

    MIN_INTERVAL_S = 0.2

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[int, tuple[float, float, float]] = {}  # pid -> (cpu s, at, %)

    def sample(self, pids: dict[str, int], restarts: dict[str, int]) -> dict[str, Any]:
        now = self._clock()
        out: dict[str, Any] = {}
        kept: dict[int, tuple[float, float, float]] = {}
        for name, pid in pids.items():
            info: dict[str, Any] = {"pid": pid, "cpu_percent": None, "rss_bytes": None,
                                    "restarts": restarts.get(name, 0)}
            got = read_proc(pid)
            if got is not None:
                cpu, rss, age = got
                last = self._last.get(pid)
                if last is None:
                    kept[pid] = (cpu, now, 100 * cpu / age)  # the average since it started
                elif now - last[1] >= self.MIN_INTERVAL_S:
                    kept[pid] = (cpu, now, 100 * max(0.0, cpu - last[0]) / (now - last[1]))
                else:
                    kept[pid] = last
                info["cpu_percent"] = round(kept[pid][2], 1)
                info["rss_bytes"] = rss
            out[name] = info
        self._last = kept
        return out
