"""Fake child processes for the supervisor tests (never part of the product's registry).

Loaded only through ``UNIUN_PROCESS_PLUGINS=fake_children`` with this folder on
``PYTHONPATH``; each registers a ``fake-*`` process whose misbehaviour is its name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from uniun.runtime.config import RuntimeConfig
from uniun.runtime.process import STOPPING, register_process


def _idle() -> int:
    while not STOPPING.is_set():
        time.sleep(0.05)
    return 0


def fake_sleeper(config: RuntimeConfig) -> int:
    """Behaves: beats and idles until told to stop."""
    return _idle()


def fake_crasher(config: RuntimeConfig) -> int:
    """Exits with an error at once, every time (a crash loop)."""
    return 3


def fake_hanger(config: RuntimeConfig) -> int:
    """Freezes (SIGSTOP, so its heartbeat thread stops too) in its first incarnation only.

    It first lives long enough to be seen up, so what the supervisor must notice is
    silence, not a failed start.
    """
    marker = config.home / "fake-hanger.froze"
    if not marker.exists():
        time.sleep(5 * config.supervisor.heartbeat_interval_s)
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    return _idle()


def fake_stuck(config: RuntimeConfig) -> int:
    """Its main loop stops ticking in its first incarnation; its health check notices."""
    from uniun.runtime.process import set_health_check
    marker = config.home / "fake-stuck.stuck"
    last_tick = [time.monotonic()]
    set_health_check(lambda: time.monotonic() - last_tick[0] < 1.0)
    first = not marker.exists()
    if first:
        marker.write_text(str(os.getpid()))
    for _ in range(20):  # tick long enough to be seen up
        last_tick[0] = time.monotonic()
        time.sleep(0.05)
    if first:
        time.sleep(3600)  # "hung": the process lives, the loop does not tick
    while not STOPPING.is_set():
        last_tick[0] = time.monotonic()
        time.sleep(0.05)
    return 0


def _loader(config: RuntimeConfig, *, announce: bool) -> int:
    """Holds the GIL for 20 heartbeat intervals once, as a runner loading a big tokenizer
    does, after announcing the silence (``announce``) or not; then idles."""
    from uniun.runtime.process import announce_quiet
    from uniun.runtime.runner_main import hold_gil
    name = "fake-loader" if announce else "fake-unannounced"
    marker = config.home / f"{name}.loaded"
    if not marker.exists():
        time.sleep(5 * config.supervisor.heartbeat_interval_s)  # be seen up first
        if announce:
            announce_quiet(60 * config.supervisor.heartbeat_interval_s)
        hold_gil(20 * config.supervisor.heartbeat_interval_s)
        marker.write_text(str(os.getpid()))
    return _idle()


def fake_loader(config: RuntimeConfig) -> int:
    return _loader(config, announce=True)


def fake_unannounced(config: RuntimeConfig) -> int:
    return _loader(config, announce=False)


def fake_parent(config: RuntimeConfig) -> int:
    """Starts a grandchild (a sleeping process) and records its pid, then idles."""
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(config.home / "fake-grandchild.pid").write_text(str(grandchild.pid))
    return _idle()


def fake_stubborn(config: RuntimeConfig) -> int:
    """Ignores SIGTERM, so only the supervisor's SIGKILL after the grace period stops it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(0.05)


for _name, _fn in (("fake-sleeper", fake_sleeper), ("fake-crasher", fake_crasher),
                   ("fake-hanger", fake_hanger), ("fake-stuck", fake_stuck),
                   ("fake-parent", fake_parent), ("fake-loader", fake_loader),
                   ("fake-unannounced", fake_unannounced),
                   ("fake-stubborn", fake_stubborn)):
    register_process(_name, _fn)
