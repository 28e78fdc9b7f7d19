"""Reading the device's power facts from sysfs, and the thread that polls them.

Where the facts are (Linux; under ``[device] sysfs_root``, default ``/sys``, so a test
or a bench drives it with a fake tree):

- ``class/power_supply/*/type``: ``Battery``, or a charger (``Mains``, ``USB``,
  ``Wireless``, ...). A charger's ``online`` is 1 while it is plugged in; a battery has
  ``status`` (``Charging``, ``Discharging``, ``Full``, ``Not charging``) and
  ``capacity`` (percent). No battery at all is a desktop on mains: ``on_battery`` false.
- ``class/thermal/thermal_zone*/temp`` (millidegrees) against the zone's
  ``trip_point_N_temp`` / ``trip_point_N_type``: at or above a ``passive`` trip is
  ``warm``, ``hot`` is ``hot``, ``critical`` is ``critical``; zones with no readable
  temperature say nothing. ``class/thermal/cooling_device*`` of type ``Processor`` with
  ``cur_state > 0`` (the CPU is being throttled) is ``warm`` at least.

A file that is missing or holds garbage makes its fact unknown (``None``); the reader
never raises for the tree's content. Cost: a dozen small reads per poll (one ``open`` +
``read`` each); sysfs attributes do not raise inotify events when their value changes,
so polling every ``power_poll_s`` (5 s) is the mechanism.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

from loguru import logger

from uniun.protocol.power_state import THERMAL_STATES, PowerState, Thermal

__all__ = ["read_power", "read_thermal", "PowerWatch"]

_CHARGERS_ONLINE_ONLY = ("Mains", "USB", "Wireless", "USB_C", "USB_PD", "USB_DCP",
                         "USB_CDP", "USB_ACA", "BrickID")
_TRIP_LEVEL: dict[str, Thermal] = {"passive": "warm", "hot": "hot", "critical": "critical"}


def _text(path: Path) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(64).strip()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _text(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def read_power(root: Path) -> PowerState:
    """The facts under ``root`` (a sysfs tree) now."""
    on_battery, percent = _read_supplies(root / "class" / "power_supply")
    return PowerState(on_battery=on_battery, percent=percent, thermal=read_thermal(root))


def _read_supplies(folder: Path) -> tuple[bool | None, float | None]:
    try:
        supplies = sorted(folder.iterdir())
    except OSError:
        supplies = []
    charger_online: bool | None = None
    statuses: list[str] = []
    levels: list[int] = []
    batteries = 0
    for supply in supplies:
        kind = _text(supply / "type")
        if kind == "Battery":
            # A device's own battery (a mouse's is scope "Device") is not the machine's.
            if _text(supply / "scope") == "Device":
                continue
            batteries += 1
            status = _text(supply / "status")
            if status:
                statuses.append(status)
            level = _int(supply / "capacity")
            if level is not None and 0 <= level <= 100:
                levels.append(level)
        elif kind in _CHARGERS_ONLINE_ONLY:
            online = _int(supply / "online")
            if online is not None:
                charger_online = bool(online) or bool(charger_online)
    percent = float(sum(levels)) / len(levels) if levels else None
    if batteries == 0:
        # No battery: a desktop (or a server) on mains, unless the tree was unreadable.
        return (False if supplies or folder.is_dir() else None), None
    if charger_online:
        return False, percent
    if "Discharging" in statuses:
        return True, percent
    if any(s in ("Charging", "Full", "Not charging") for s in statuses):
        return False, percent
    if charger_online is False:
        return True, percent
    return None, percent


def read_thermal(root: Path) -> Thermal | None:
    """The hottest state any thermal zone or CPU cooling device says (None: unknown)."""
    folder = root / "class" / "thermal"
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return None
    worst = -1
    for entry in entries:
        name = entry.name
        if name.startswith("thermal_zone"):
            level = _zone_level(entry)
        elif name.startswith("cooling_device"):
            level = _cooling_level(entry)
        else:
            continue
        if level is not None:
            worst = max(worst, level)
    return THERMAL_STATES[worst] if worst >= 0 else None


def _zone_level(zone: Path) -> int | None:
    temp = _int(zone / "temp")
    if temp is None:
        return None
    level = 0
    for n in range(32):  # zones have a handful of trips; the ids are dense from 0
        trip = _int(zone / f"trip_point_{n}_temp")
        if trip is None:
            break
        kind = _text(zone / f"trip_point_{n}_type")
        state = _TRIP_LEVEL.get(kind or "")
        if state is not None and trip > 0 and temp >= trip:
            level = max(level, THERMAL_STATES.index(state))
    return level


def _cooling_level(device: Path) -> int | None:
    if _text(device / "type") != "Processor":
        return None  # fans run on cool days too; only CPU throttling says "warm"
    current = _int(device / "cur_state")
    if current is None:
        return None
    return 1 if current > 0 else 0


class PowerWatch:
    """A daemon thread that reads ``root`` every ``poll_s`` and calls ``changed`` with
    the new :class:`PowerState` when it differs from the last one (and once at start)."""

    def __init__(self, root: Path, changed: Callable[[PowerState], None],
                 poll_s: float = 5.0) -> None:
        self.root = root
        self.poll_s = poll_s
        self._changed = changed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="power-watch", daemon=True)
        self.last: PowerState | None = None
        self.reads = 0
        self.cpu_s = 0.0  # thread CPU time spent reading (the bench reports it)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(RuntimeError):
            self._thread.join(timeout=2)

    def poll(self) -> PowerState:
        """One read; calls ``changed`` if the facts changed."""
        started = time.thread_time()
        state = read_power(self.root)
        self.cpu_s += time.thread_time() - started
        self.reads += 1
        if state != self.last:
            if self.last is not None:
                logger.info("device power: {}", state.describe())
            self.last = state
            self._changed(state)
        return state

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:
                logger.exception("power watch: read failed; trying again")
            self._stop.wait(self.poll_s)
