"""Who owns a producer job that a command line (``open-note``) submitted, and whether
that process still lives.

A CLI that stores a job for itself can be killed (SIGKILL, a closed terminal) before it
stores the result; the extract producer then adopts the job. Waiting for the job to go
untouched for ``ORPHAN_AFTER_S`` (600 s) is the fallback; with the owner's stamp in the
job's meta it can adopt as soon as the owner is gone. The stamp is the pid plus the
process's start time (``/proc/PID/stat`` field 22), so a reused pid is not mistaken for
the owner.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["owner_stamp", "owner_gone"]


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] == "Z":  # a zombie has exited; only its parent has not reaped it yet
        return None
    return int(fields[19])  # field 22 overall; fields[0] is field 3 (the state)


def owner_stamp() -> dict[str, Any]:
    """This process as the owner of a job, for the job's meta."""
    pid = os.getpid()
    return {"owner_pid": pid, "owner_start": _start_time(pid)}


def owner_gone(meta: dict[str, Any]) -> bool:
    """True if ``meta`` names an owner process that no longer runs (False if it names
    none, or if it cannot tell: then only the idle-time fallback applies)."""
    pid, start = meta.get("owner_pid"), meta.get("owner_start")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if not os.path.isdir("/proc"):  # not Linux: cannot tell
        return False
    now = _start_time(pid)
    return now is None or (isinstance(start, int) and now != start)
