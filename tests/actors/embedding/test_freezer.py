"""The pool's freezer (``[device] freeze_embed_workers``): real processes are stopped
(SIGSTOP) while the scheduler's device state says interactive, continued after, and
continued when the freezer closes, whatever the state then."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import zmq

from tests.wait import wait_for
from uniun.actors.embedding.freezer import Freezer
from uniun.actors.scheduler.device_signal import DevicePublisher
from uniun.protocol.device_state import YieldGate


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def test_workers_are_stopped_while_interactive_and_continued_after(tmp_path: Path) -> None:
    ctx = zmq.Context()
    pub = DevicePublisher(f"ipc://{tmp_path / 'device.sock'}", ctx, republish_s=0.1)
    pub.start()
    workers = [subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
               for _ in range(2)]
    freezer = Freezer(YieldGate(pub.endpoint, ctx=ctx), lambda: [w.pid for w in workers])
    try:
        assert not any(_stopped(w.pid) for w in workers)
        pub.set(True)
        wait_for("both workers stopped", lambda: all(_stopped(w.pid) for w in workers))
        pub.set(False)
        wait_for("both workers continued", lambda: not any(_stopped(w.pid) for w in workers))
        pub.set(True)
        wait_for("stopped again", lambda: all(_stopped(w.pid) for w in workers))
        assert freezer.freezes == 2
        freezer.close()  # interactive still on: closing continues them anyway
        assert not any(_stopped(w.pid) for w in workers)
    finally:
        freezer.close()
        for w in workers:
            w.kill()
            w.wait()
        pub.close()
        ctx.term()
