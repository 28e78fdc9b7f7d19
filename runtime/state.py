"""The running runtime's footprint in its run dir: the lock, the state file, the endpoint.

One runtime per home. The supervisor holds an exclusive ``flock`` on
``run/supervisor.lock`` for its whole life; the kernel drops it when the process dies,
however it dies, so a lock left by a crashed runtime is simply free again (no pid
guessing, no stale-lock heuristics). ``run/supervisor.json`` says who holds it and what
runs (pid, state, children's pids, front endpoint); ``stop`` and ``status`` read it.
Everything is written atomically (temp file + rename) and owner-only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Any

LOCK_FILE = "supervisor.lock"
STATE_FILE = "supervisor.json"
ENDPOINT_FILE = "front.endpoint"
HTTP_ENDPOINT_FILE = "http.endpoint"  # the gateway's base URL while it serves (http_main)
EFFECTIVE_CONFIG = "effective.toml"


class RuntimeRunning(RuntimeError):
    """Another supervisor holds this home's lock."""

    def __init__(self, run_dir: Path, state: dict[str, Any] | None) -> None:
        self.state = state or {}
        pid = self.state.get("pid", "?")
        front = self.state.get("front", "?")
        super().__init__(f"a runtime is already running in {run_dir.parent} (supervisor pid "
                         f"{pid}, front {front}); stop it with: uniun-runtime stop")


class RuntimeLock:
    """The held lock; keep the object alive (and its fd open) as long as the runtime runs."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RuntimeLock:
        """Take the lock or raise :class:`RuntimeRunning`."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeRunning(self.path.parent, read_state(self.path.parent)) from None
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def is_running(run_dir: Path) -> bool:
    """True while some supervisor holds ``run_dir``'s lock."""
    path = run_dir / LOCK_FILE
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def write_private(path: Path, text: str) -> None:
    """Atomically write ``text`` to ``path`` with mode 0600."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(tmp, path)


def write_state(run_dir: Path, state: dict[str, Any]) -> None:
    write_private(run_dir / STATE_FILE, json.dumps(state, indent=1, sort_keys=True) + "\n")


def read_state(run_dir: Path) -> dict[str, Any] | None:
    """The state file's contents, or None if there is none (or it is unreadable)."""
    try:
        data = json.loads((run_dir / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def clear_state(run_dir: Path) -> None:
    """Remove what only makes sense while running (the lock file itself stays)."""
    for name in (STATE_FILE,):
        with contextlib.suppress(FileNotFoundError):
            (run_dir / name).unlink()
