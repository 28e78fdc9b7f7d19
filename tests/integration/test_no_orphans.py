"""A SIGKILLed supervisor leaves nothing behind: no child, no grandchild.

The supervisor cannot clean up after a SIGKILL; each child asked Linux for SIGKILL when
its parent dies (``PR_SET_PDEATHSIG``, runtime/process.py), and the embedding pool's
workers asked the same of the pool, so the deaths cascade: supervisor -> pool ->
workers.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from uniun.actors.embedding.workers import read_pids

from .harness import BASE_CONFIG, Runtime, wait_for

pytestmark = pytest.mark.integration

CONFIG = BASE_CONFIG.replace("[embed]\nenabled = false", "[embed]\nenabled = true\nworkers = 2")


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigkill_of_the_supervisor_takes_every_child_and_grandchild_with_it(
        tmp_path: Path, tiny_model: str, minilm_dir: Path) -> None:
    rt = Runtime(tmp_path / "rt", CONFIG)
    rt.env["UNIUN_CHILDREN"] = "scheduler,runner,embed"
    rt.start()
    try:
        run = rt.home / "run"
        workers = wait_for("two embedding workers", lambda: (
            w if len(w := read_pids(run)) == 2 else None))
        children = json.loads((run / "supervisor.json").read_text())["children"]
        pids = [p for p in children.values() if isinstance(p, int)] + list(workers.values())
        assert len(pids) == 5 and all(running(p) for p in pids)
        assert rt.proc is not None
        os.kill(rt.proc.pid, signal.SIGKILL)
        rt.proc.wait()
        wait_for("every child and grandchild to be gone",
                 lambda: not any(running(p) for p in pids))
    finally:
        rt.stop()
