"""The power watch's reader on fake sysfs trees (``[device] sysfs_root``): a laptop on
battery and on its charger, a desktop with no battery, heat against the trip points,
and trees that are missing or hold garbage (unknown, never a crash)."""

from __future__ import annotations

from pathlib import Path

from uniun.actors.scheduler.power_reader import PowerWatch, read_power
from uniun.protocol.power_state import PowerState
from uniun.runtime.bench.fake_sysfs import write_power, write_thermal


def test_a_laptop_on_battery_and_on_its_charger(tmp_path: Path) -> None:
    write_power(tmp_path, battery=15, charging=False)
    write_thermal(tmp_path, temp_c=50)
    assert read_power(tmp_path) == PowerState(on_battery=True, percent=15.0,
                                              thermal="nominal")
    write_power(tmp_path, battery=15, charging=True)
    assert read_power(tmp_path).on_battery is False


def test_heat_is_read_against_the_trip_points(tmp_path: Path) -> None:
    for temp, state in ((79.9, "nominal"), (80, "warm"), (96, "hot"), (110, "critical")):
        write_thermal(tmp_path, temp_c=temp)
        assert read_power(tmp_path).thermal == state, temp


def test_a_throttled_cpu_cooling_device_reads_warm(tmp_path: Path) -> None:
    write_thermal(tmp_path, temp_c=40)
    device = tmp_path / "class" / "thermal" / "cooling_device0"
    device.mkdir()
    (device / "type").write_text("Processor\n")
    (device / "cur_state").write_text("0\n")
    assert read_power(tmp_path).thermal == "nominal"
    (device / "cur_state").write_text("3\n")
    assert read_power(tmp_path).thermal == "warm"


def test_a_desktop_without_a_battery_is_on_mains(tmp_path: Path) -> None:
    write_power(tmp_path, battery=None, charging=True)
    assert read_power(tmp_path) == PowerState(on_battery=False)
    empty = tmp_path / "desktop"
    (empty / "class" / "power_supply").mkdir(parents=True)
    assert read_power(empty).on_battery is False


def test_missing_or_garbage_files_are_unknown_never_a_crash(tmp_path: Path) -> None:
    assert read_power(tmp_path / "nowhere") == PowerState()
    write_power(tmp_path, battery=50, charging=False)
    bat = tmp_path / "class" / "power_supply" / "BAT0"
    (bat / "capacity").write_text("lots\n")
    (bat / "status").write_bytes(b"\xff\xfe\n")
    (tmp_path / "class" / "power_supply" / "AC" / "online").write_text("?\n")
    zone = tmp_path / "class" / "thermal" / "thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "temp").write_text("hot\n")
    state = read_power(tmp_path)
    assert state.percent is None and state.on_battery is None and state.thermal is None
    (bat / "status").unlink()
    (zone / "temp").write_text("-274000\n")  # no trip reached: nominal, not a crash
    assert read_power(tmp_path).thermal == "nominal"


def test_the_watch_reports_a_change_once(tmp_path: Path) -> None:
    seen: list[PowerState] = []
    watch = PowerWatch(tmp_path, seen.append, poll_s=60)
    write_power(tmp_path, battery=60, charging=False)
    watch.poll()
    watch.poll()
    write_power(tmp_path, battery=59, charging=False)
    watch.poll()
    assert [s.percent for s in seen] == [60.0, 59.0] and watch.reads == 3
