"""A fake sysfs tree for the power watch (``[device] sysfs_root``): what a laptop's
``/sys/class/power_supply`` and ``/sys/class/thermal`` hold, written as plain files, so a
bench (``bench --device``) or a test puts a real runtime on a battery or into a heat state
without one. Rewriting the files is how the device "changes"; the watch polls them."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_power", "write_thermal"]


def _put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)  # a poll never reads half a file


def write_power(root: Path, *, battery: int | None, charging: bool) -> None:
    """A charger (``AC``, online while ``charging``) and, unless ``battery`` is None, a
    battery ``BAT0`` at ``battery`` percent, charging or discharging."""
    supply = root / "class" / "power_supply"
    _put(supply / "AC" / "type", "Mains")
    _put(supply / "AC" / "online", "1" if charging else "0")
    if battery is not None:
        _put(supply / "BAT0" / "type", "Battery")
        _put(supply / "BAT0" / "status", "Charging" if charging else "Discharging")
        _put(supply / "BAT0" / "capacity", str(battery))


def write_thermal(root: Path, *, temp_c: float, passive_c: float = 80.0,
                  hot_c: float = 95.0, critical_c: float = 105.0) -> None:
    """One zone at ``temp_c`` with a passive, a hot and a critical trip point."""
    zone = root / "class" / "thermal" / "thermal_zone0"
    _put(zone / "type", "x86_pkg_temp")
    _put(zone / "temp", str(int(temp_c * 1000)))
    for n, (kind, at) in enumerate((("passive", passive_c), ("hot", hot_c),
                                    ("critical", critical_c))):
        _put(zone / f"trip_point_{n}_type", kind)
        _put(zone / f"trip_point_{n}_temp", str(int(at * 1000)))
