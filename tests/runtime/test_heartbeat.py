"""A child's heartbeats, over a real ipc PULL socket, as the supervisor hears them.

The supervisor starts each child only when the previous one has sent its first beat, so
a first beat that waits a whole interval delays ``uniun-runtime start`` by that much per
child.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from uniun.runtime.heartbeat import (
    Beat,
    HeartbeatMonitor,
    HeartbeatSender,
    supervisor_endpoint,
)

LONG_INTERVAL_S = 60.0  # far longer than any wait below: only the first beat can arrive


def _beat_where(monitor: HeartbeatMonitor, wanted: Callable[[Beat], bool],
                within_s: float) -> Beat | None:
    """The first beat heard within ``within_s`` for which ``wanted`` holds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for beat in monitor.poll(0.1):
            if wanted(beat):
                return beat
    return None


def test_the_first_beat_arrives_without_waiting_out_an_interval(tmp_path: Path) -> None:
    """ZeroMQ connects asynchronously, so the very first send finds no connection; the
    sender must try again soon, not one interval later."""
    endpoint = supervisor_endpoint(tmp_path)
    monitor = HeartbeatMonitor(endpoint)
    sender = HeartbeatSender("child", endpoint=endpoint, interval_s=LONG_INTERVAL_S).start()
    try:
        beat = _beat_where(monitor, lambda _: True, within_s=20.0)
        assert beat is not None, "no beat within 20 s; the first one waited out the interval"
        assert beat.name == "child" and beat.quiet_s == 0.0
    finally:
        sender.stop()
        monitor.close()


def test_an_announced_silence_sent_before_the_connection_is_not_lost(tmp_path: Path) -> None:
    """A process that announces a long load at once (the runner does, before its first
    model load) must have that announcement delivered, not dropped with the failed send."""
    endpoint = supervisor_endpoint(tmp_path)
    monitor = HeartbeatMonitor(endpoint)
    sender = HeartbeatSender("runner", endpoint=endpoint, interval_s=LONG_INTERVAL_S).start()
    try:
        assert sender.announce_quiet(30.0, wait_s=20.0)
        beat = _beat_where(monitor, lambda b: b.quiet_s > 0, within_s=20.0)
        assert beat is not None and 25.0 < beat.quiet_s <= 30.0, beat
    finally:
        sender.stop()
        monitor.close()
