"""Parked-KV caps sized from the model and the machine (``models/snapshot_budget.py``).

The sizing is pure: the model's KV bytes per position, the machine's memory and the free
disk are given, so every case is checked on any machine. The readers of /proc and the
cgroup files are checked on fake trees of those files.
"""

from __future__ import annotations

from pathlib import Path

from uniun.models.snapshot_budget import (
    AUTO,
    DISK_SHARE,
    MachineMemory,
    kv_bytes_per_token,
    machine_memory,
    snapshot_caps,
)

GIB = 1024 ** 3
SMOLLM2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "hidden_size": 576}
LLAMA_3B = {"num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
            "hidden_size": 3072, "head_dim": 128}
BIG_MACHINE = MachineMemory(total=24 * GIB, available=20 * GIB)


def caps(bpt: int, memory: MachineMemory = BIG_MACHINE, disk_free: int = 100 * GIB,
         **given: int):  # type: ignore[no-untyped-def]
    return snapshot_caps(kv_bytes_per_token=bpt, memory=memory, disk_free=disk_free,
                         positions=8192, memory_share=0.25, spill_positions=32768,
                         fallback_memory=256 << 20, fallback_disk=1 << 30, **given)


def test_kv_bytes_per_position_come_from_config_json() -> None:
    assert kv_bytes_per_token(SMOLLM2) == 2 * 30 * 3 * 64 * 4 == 46_080
    assert kv_bytes_per_token(LLAMA_3B) == 224 * 1024  # 224 KiB, as the issue says
    assert kv_bytes_per_token({"hidden_size": 8}) == 0  # unknown


def test_the_cap_is_positions_of_this_models_kv_on_a_roomy_machine() -> None:
    small, big = caps(46_080), caps(224 * 1024)
    assert small.memory_bytes == 8192 * 46_080
    assert big.memory_bytes == 8192 * 224 * 1024  # four parked 2,000-token 3B jobs fit
    assert big.memory_bytes >= 4 * 2000 * 224 * 1024
    assert big.disk_bytes == 32768 * 224 * 1024


def test_a_small_machine_bounds_the_cap_by_its_share_of_the_room() -> None:
    phone = MachineMemory(total=8 * GIB, available=3 * GIB)
    c = caps(224 * 1024, memory=phone, disk_free=4 * GIB)
    assert c.memory_bytes == int(0.25 * 3 * GIB)
    assert c.disk_bytes == int(DISK_SHARE * 4 * GIB)
    limited = MachineMemory(total=24 * GIB, available=20 * GIB, cgroup_limit=4 * GIB,
                            cgroup_usage=3 * GIB)  # the cgroup leaves 1 GiB
    assert caps(224 * 1024, memory=limited).memory_bytes == int(0.25 * GIB)


def test_configured_bytes_win_and_an_unknown_model_gets_the_fallbacks() -> None:
    c = caps(224 * 1024, memory_cap=0, disk_cap=123)
    assert (c.memory_bytes, c.disk_bytes) == (0, 123)
    assert c.memory_rule == c.disk_rule == "configured"
    assert caps(0, memory_cap=AUTO).memory_bytes == 256 << 20
    assert caps(0).disk_bytes == 1 << 30


def test_the_machine_is_read_from_meminfo_and_the_cgroup(tmp_path: Path) -> None:
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal:       8000000 kB\nMemFree: 1 kB\n"
                                  "MemAvailable:   3000000 kB\n")
    (proc / "self" / "cgroup").write_text("0::/app.slice/uniun\n")
    assert machine_memory(proc, cg) == MachineMemory(8_192_000_000, 3_072_000_000)
    own = cg / "app.slice" / "uniun"
    own.mkdir(parents=True)
    (own / "memory.max").write_text("2000000000\n")
    (own / "memory.current").write_text("500000000\n")
    mem = machine_memory(proc, cg)
    assert (mem.cgroup_limit, mem.room) == (2_000_000_000, 1_500_000_000)
    (own / "memory.max").write_text("max\n")  # v2's "no limit"
    assert machine_memory(proc, cg).cgroup_limit is None
