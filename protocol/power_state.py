"""What the device says about its power: charger, battery level, heat (docs/device.md).

One record, :class:`PowerState`, for both ways the scheduler learns it: read from sysfs on
a Linux machine (``actors/scheduler/power_reader.py``), or pushed by an app over the wire
as the optional ``power`` map of a ``lifecycle`` message (a phone or a Mac, where the app
asks the OS; docs/protocol.md). Every field may be unknown (``None``): a desktop has no
battery, a container has no thermal zones, an app may know only some facts. Pure: no I/O.

Thermal states, from cool to hot, are the policy's four steps: ``nominal``; ``warm`` (a
passive trip point reached: the kernel starts to throttle); ``hot``; ``critical``. They
map one to one onto Android's ``THERMAL_STATUS_*`` and macOS's ``thermalState`` in the
table of docs/device.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, get_args

from uniun.protocol.errors import InvalidField

__all__ = ["THERMAL_STATES", "Thermal", "PowerState", "parse_power", "merge"]

Thermal = Literal["nominal", "warm", "hot", "critical"]
THERMAL_STATES: tuple[Thermal, ...] = get_args(Thermal)
_FIELDS = ("on_battery", "percent", "thermal", "user_idle")


@dataclass(frozen=True)
class PowerState:
    """The facts; ``None`` in a field means unknown (never a guess)."""

    on_battery: bool | None = None  # running from the battery (not on a charger)
    percent: float | None = None  # battery level 0..100
    thermal: Thermal | None = None
    user_idle: bool | None = None  # the user is away (screen off / session idle)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """A short line for a log or a timeline mark: ``battery 15 %, warm``."""
        parts = []
        if self.on_battery is None:
            parts.append("power unknown")
        else:
            parts.append("battery" if self.on_battery else "charger")
        if self.percent is not None:
            parts.append(f"{self.percent:.0f} %")
        parts.append(self.thermal or "thermal unknown")
        if self.user_idle:
            parts.append("user idle")
        return ", ".join(parts)


def merge(pushed: PowerState, read: PowerState) -> PowerState:
    """An app's pushed facts win over what sysfs says, field by field; sysfs fills the
    fields the app did not name (an app that knows only the battery keeps the host's
    thermal reading)."""
    values = {name: getattr(pushed, name) for name in _FIELDS
              if getattr(pushed, name) is not None}
    return replace(read, **values)


def parse_power(value: Any) -> PowerState:
    """The wire's ``power`` map -> :class:`PowerState`; raises :class:`InvalidField`
    naming the field (``power.percent``) for anything malformed. Unknown keys are
    ignored (a newer app may say more); a key given as nil means unknown."""
    if not isinstance(value, dict):
        raise InvalidField("power", "must be a map of on_battery, percent, thermal, "
                                    "user_idle")
    on_battery = value.get("on_battery")
    if on_battery is not None and not isinstance(on_battery, bool):
        raise InvalidField("power.on_battery", "must be true, false or nil")
    percent = value.get("percent")
    if percent is not None:
        if (isinstance(percent, bool) or not isinstance(percent, (int, float))
                or not math.isfinite(percent) or not 0 <= percent <= 100):
            raise InvalidField("power.percent", "must be a number 0..100 or nil")
        percent = float(percent)
    thermal = value.get("thermal")
    if thermal is not None and thermal not in THERMAL_STATES:
        raise InvalidField("power.thermal", f"must be one of {', '.join(THERMAL_STATES)} "
                                            "or nil")
    user_idle = value.get("user_idle")
    if user_idle is not None and not isinstance(user_idle, bool):
        raise InvalidField("power.user_idle", "must be true, false or nil")
    return PowerState(on_battery=on_battery, percent=percent, thermal=thermal,
                      user_idle=user_idle)
