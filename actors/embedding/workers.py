"""The pool's view of one embedding worker process: spawn, watch, kill, back off.

Mechanism only: *what* to do with a dead worker's request is the pool's decision
(``pool.py``); this file knows how to start a child, notice that it ended, and
when it may start again.

States: ``stopped`` -> ``starting`` (spawned, loading the model) -> ``idle`` <-> ``busy``;
an exit from any state goes back to ``stopped``. A worker that ends before it was ever
ready waits 0.5 s, doubling per repeat, at most 30 s, before its next start, so a
broken model cannot make the pool fork in a tight loop; one that ends after being ready
restarts at once.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

BACKOFF_FIRST_S = 0.5  # first delay after a worker died before it was ready, s
BACKOFF_MAX_S = 30.0  # longest such delay, s


@dataclass
class WorkerProcess:
    """One worker slot (``embed-0``, ...); its process changes, its name does not."""

    name: str
    generation: int = 0  # incarnation number, part of the DEALER identity
    proc: subprocess.Popen[bytes] | None = None
    identity: bytes = b""
    state: str = "stopped"
    request: Any = None  # the pool's request record while busy
    busy_since: float = 0.0
    next_start: float = 0.0
    failures_in_row: int = 0  # exits before becoming ready
    restarts: int = 0
    served: int = 0
    batches_done: int = 0  # micro-batches of the current request done, as last reported
    paused: bool = False  # waiting for interactive work, as last reported

    @property
    def ready(self) -> bool:
        return self.state in ("idle", "busy")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def spawn(self, argv: tuple[str, ...], *, backend: str, model_dir: Path, threads: int,
              log_level: str, log_file: Path, device_state: str = "",
              micro_batch: int | None = None) -> None:
        """Start a new incarnation (``argv`` runs one worker process); it says ``ready`` on
        ``backend`` once loaded."""
        self.generation += 1
        self.identity = f"{self.name}.{self.generation}".encode()
        cmd = [*argv, "--name", self.name,
               "--identity", self.identity.decode(), "--backend", backend,
               "--model-dir", str(model_dir), "--threads", str(threads),
               "--parent-pid", str(os.getpid()), "--log-level", log_level,
               "--log-file", str(log_file)]
        if device_state:
            cmd += ["--device-state", device_state]
        if micro_batch is not None:
            cmd += ["--micro-batch", str(micro_batch)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        self.state = "starting"
        logger.info("started {} (pid {}, generation {})", self.name, self.proc.pid,
                    self.generation)

    def exit_code(self) -> int | None:
        """The return code if the current process has ended, else None."""
        return None if self.proc is None else self.proc.poll()

    def kill(self) -> None:
        """SIGKILL the current process; the next :meth:`exit_code` reports it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def reap(self, now: float) -> Any:
        """Forget the ended process, schedule the next start; return its request (or None)."""
        request, was_ready = self.request, self.ready
        self.proc, self.request, self.state = None, None, "stopped"
        self.batches_done, self.paused = 0, False
        self.restarts += 1
        if was_ready:
            self.failures_in_row, self.next_start = 0, now
        else:
            self.failures_in_row += 1
            self.next_start = now + min(BACKOFF_MAX_S,
                                        BACKOFF_FIRST_S * 2 ** (self.failures_in_row - 1))
        return request

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def wait_or_kill(self, grace_s: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "pid": self.pid, "state": self.state,
                "restarts": self.restarts, "served": self.served,
                "request": getattr(self.request, "msg_id", None),
                "batches_done": self.batches_done if self.request is not None else None,
                "paused": self.paused and self.request is not None}


# -- the workers' pids, published for the scheduler's ``status.processes`` ----------------
PIDS_FILE = "embed.workers.json"


def publish_pids(run_dir: Path, pids: dict[str, int]) -> None:
    """Write ``{name: pid}`` of the live workers to ``run/embed.workers.json`` atomically."""
    import json

    path = run_dir / PIDS_FILE
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(pids))
    os.replace(tmp, path)


def read_pids(run_dir: Path) -> dict[str, int]:
    """The published worker pids that are still alive (a killed pool leaves a stale file)."""
    import json

    try:
        raw = json.loads((run_dir / PIDS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    alive = {}
    for name, pid in raw.items() if isinstance(raw, dict) else ():
        if isinstance(pid, int) and pid > 0:
            try:
                os.kill(pid, 0)
            except OSError:
                continue
            alive[str(name)] = pid
    return alive
