"""The embedding pool beside a CPU hog (part of ``bench --device``; docs/device.md).

The pool is started alone, the way the supervisor starts it
(``python -m uniun.runtime.process embed``), at its class's default priority and, for
comparison, with ``embed_priority = "idle"`` (SCHED_IDLE). Measured: seconds from the
spawn until every worker is ready, and one request of 8 texts, quiet and beside two
nice-0 busy loops (``while :; do :; done``, one per core of a 2-core machine). The hog
is killed by its pids when the measure ends, whatever happens.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from uniun.protocol.embed_client import EmbedClient

READY_CAP_S = 120.0  # a pool not ready by then is reported as such, not waited for
TEXTS = [f"note {i}: the tide comes in twice a day, pulled by the moon" for i in range(8)]


@contextmanager
def cpu_hog(loops: int = 2) -> Iterator[list[int]]:
    """``loops`` busy shell loops at nice 0; killed (by pid) when the block ends."""
    procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(loops)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()


def _pool_once(priority: str | None) -> dict[str, Any]:
    """One pool: ``priority`` is its ``embed_priority`` (None: the default)."""
    with tempfile.TemporaryDirectory(prefix="ub-") as tmp:  # short: ipc paths are short
        home = Path(tmp)
        endpoint = f"ipc://{home}/embed.sock"
        (home / "uniun.toml").write_text(
            f'[embed]\nenabled = true\nworkers = 2\nendpoint = "{endpoint}"\n'
            "[device]\nyield_signal = false\n"
            + (f'embed_priority = "{priority}"\n' if priority else ""))
        env = {k: v for k, v in os.environ.items() if k != "UNIUN_CONFIG"}
        env["UNIUN_HOME"] = str(home)
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "uniun.runtime.process", "embed",
                                 "--config", str(home / "uniun.toml")],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)
        out: dict[str, Any] = {"priority": priority or "default"}
        try:
            with EmbedClient(endpoint, timeout=READY_CAP_S, connect_timeout=READY_CAP_S) as c:
                ready = None
                while time.monotonic() - started < READY_CAP_S:
                    try:
                        workers = c.status(timeout=5)["workers"]
                        if workers and all(w["state"] in ("idle", "busy") for w in workers):
                            ready = time.monotonic() - started
                            break
                    except (ConnectionError, TimeoutError):
                        pass
                    time.sleep(0.2)
                out["ready_s"] = ready
                if ready is not None:
                    sent = time.monotonic()
                    c.embed(TEXTS, timeout=READY_CAP_S)
                    out["embed_8_texts_s"] = time.monotonic() - sent
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return out


def embed_with_and_without_hog(log: Callable[[str], None]) -> dict[str, Any]:
    result: dict[str, Any] = {"quiet": _pool_once(None)}
    log(f"device: pool quiet {result['quiet']}")
    with cpu_hog():
        result["hog"] = _pool_once(None)
        log(f"device: pool beside the hog {result['hog']}")
        result["hog_sched_idle"] = _pool_once("idle")
        log(f"device: pool beside the hog at SCHED_IDLE {result['hog_sched_idle']}")
    quiet, hog = result["quiet"], result["hog"]
    if quiet.get("ready_s") and hog.get("ready_s"):
        result["ready_hog_vs_quiet"] = hog["ready_s"] / quiet["ready_s"]
    if quiet.get("embed_8_texts_s") and hog.get("embed_8_texts_s"):
        result["embed_hog_vs_quiet"] = hog["embed_8_texts_s"] / quiet["embed_8_texts_s"]
    return result
