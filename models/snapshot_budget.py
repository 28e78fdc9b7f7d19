"""How much memory and disk parked KV may take: sized from the model and the machine.

Why: a fixed cap fits one model size only. SmolLM2-135M's KV is 45 KiB per position, a
3B model's 224 KiB, so the 256 MiB that parks five 1,000-token SmolLM2 jobs does not
hold one 2,000-token 3B job (~450 MB): every preemption of such a job would spill it
to disk (or drop it) while the chat that preempted it waits. The cap is therefore a
number of *positions* (the work parked jobs hold) times the model's KV bytes per
position, bounded by a share of the memory the machine can give (the smaller of
``MemAvailable`` and what the process's cgroup still allows), so a big model on a
small machine still leaves room for the model itself. Explicit byte caps in the
configuration win over both (docs/kv-cache.md, "How big the parking is").

:func:`snapshot_caps` is pure (every input injected); :func:`machine_memory` and
:func:`free_disk` read the machine.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["AUTO", "DISK_SHARE", "Caps", "MachineMemory", "free_disk", "kv_bytes_per_token",
           "machine_memory", "snapshot_caps"]

AUTO = -1  # a byte cap of -1 in the configuration: size it here
DISK_SHARE = 0.25  # the most of the spill folder's free disk the spill cap may take


@dataclass(frozen=True)
class MachineMemory:
    """Bytes: ``total`` (MemTotal), ``available`` (MemAvailable); the cgroup's
    ``limit`` and ``usage`` when a limit is set (None otherwise)."""

    total: int
    available: int
    cgroup_limit: int | None = None
    cgroup_usage: int | None = None

    @property
    def room(self) -> int:
        """What this process can still take: MemAvailable, or less under a cgroup limit."""
        room = self.available
        if self.cgroup_limit is not None:
            room = min(room, max(0, self.cgroup_limit - (self.cgroup_usage or 0)))
        return max(0, room)


@dataclass(frozen=True)
class Caps:
    """The parking's caps in bytes, and how each was chosen (for the log line)."""

    memory_bytes: int
    disk_bytes: int
    memory_rule: str
    disk_rule: str


def kv_bytes_per_token(config: Mapping[str, Any]) -> int:
    """KV bytes one position costs in float32, from a model's ``config.json``
    (2 x layers x kv heads x head dim x 4); 0 when the config does not say."""
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
        dim = int(config.get("head_dim")
                  or int(config["hidden_size"]) // int(config["num_attention_heads"]))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return 0
    return 2 * layers * heads * dim * 4


def snapshot_caps(*, kv_bytes_per_token: int, memory: MachineMemory, disk_free: int,
                  positions: int, memory_share: float, spill_positions: int,
                  memory_cap: int = AUTO, disk_cap: int = AUTO,
                  fallback_memory: int, fallback_disk: int) -> Caps:
    """The parking's caps for one model on one machine.

    Memory: ``positions`` x ``kv_bytes_per_token``, at most ``memory_share`` of the
    machine's room (:attr:`MachineMemory.room`). Disk: ``spill_positions`` x the same,
    at most :data:`DISK_SHARE` of ``disk_free``. A cap given in bytes (anything but
    :data:`AUTO`) is taken as it is; a model whose KV size is unknown gets the fallbacks.
    """
    bpt = max(0, int(kv_bytes_per_token))
    if memory_cap != AUTO:
        mem, mem_rule = int(memory_cap), "configured"
    elif bpt == 0:
        mem, mem_rule = int(fallback_memory), "default (KV size unknown)"
    else:
        wanted, room = positions * bpt, int(memory_share * memory.room)
        mem = min(wanted, room)
        mem_rule = (f"{positions} positions x {bpt} B" if mem == wanted
                    else f"{memory_share:g} of {memory.room} B of memory room")
    if disk_cap != AUTO:
        disk, disk_rule = int(disk_cap), "configured"
    elif bpt == 0:
        disk, disk_rule = int(fallback_disk), "default (KV size unknown)"
    else:
        wanted, room = spill_positions * bpt, int(DISK_SHARE * max(0, disk_free))
        disk = min(wanted, room)
        disk_rule = (f"{spill_positions} positions x {bpt} B" if disk == wanted
                     else f"{DISK_SHARE:g} of {disk_free} B free disk")
    return Caps(max(0, mem), max(0, disk), mem_rule, disk_rule)


def _meminfo(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[name] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _own_cgroup(proc: Path) -> str:
    """This process's cgroup v2 path, relative ("" for the root or when unknown)."""
    try:
        for line in (proc / "self" / "cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].strip().lstrip("/")
    except OSError:
        pass
    return ""


def machine_memory(proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")
                   ) -> MachineMemory:
    """The machine's memory now (Linux: /proc/meminfo and the cgroup v2 or v1 limit);
    elsewhere, whatever ``os.sysconf`` says, available taken as half of it."""
    try:
        info = _meminfo((proc / "meminfo").read_text())
        total, available = info["MemTotal"], info.get("MemAvailable", info["MemTotal"] // 2)
    except (OSError, KeyError):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = 0
        return MachineMemory(total, total // 2)
    own = cgroup / _own_cgroup(proc)
    limit = _read_int(own / "memory.max")
    usage = _read_int(own / "memory.current")
    if limit is None:  # cgroup v1
        limit = _read_int(cgroup / "memory" / "memory.limit_in_bytes")
        usage = _read_int(cgroup / "memory" / "memory.usage_in_bytes")
    if limit is not None and limit >= total:  # v1 says "no limit" with a huge number
        limit = usage = None
    return MachineMemory(total, available, limit, usage)


def free_disk(path: Path) -> int:
    """Free bytes on the file system of ``path`` (its nearest existing parent); 0 if unknown."""
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return 0
