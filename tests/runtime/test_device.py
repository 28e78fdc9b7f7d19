"""The OS side of scheduling the device (docs/device.md): thread budget (pure) and lowered
CPU priority (real)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from uniun.runtime.config import ConfigError, load_config_text
from uniun.runtime.device import describe, priority_class, thread_budget


def test_two_cores_give_the_runner_both_and_each_worker_one() -> None:
    b = thread_budget(2, embed_workers=2)
    assert (b.runner_threads, b.embed_threads, b.background_threads) == (2, 1, 1)


def test_many_cores_are_shared_without_oversubscribing() -> None:
    for cores in (4, 8, 16, 64):
        b = thread_budget(cores, embed_workers=2)
        assert b.runner_threads + 2 * b.embed_threads <= max(cores, b.runner_threads + 2)
        assert b.runner_threads <= 8
    assert thread_budget(8, embed_workers=2, runner_threads=3).runner_threads == 3


def test_the_device_section_is_checked() -> None:
    cfg = load_config_text("[device]\nbackground_priority = \"nice\"\ncores = 4\n")
    assert cfg.device.background_priority == "nice" and cfg.budget().cores == 4
    with pytest.raises(ConfigError, match="background_priority"):
        load_config_text("[device]\nbackground_priority = \"low\"\n")
    off = load_config_text("[device]\nthread_budget = false\n[runner]\nintra_op_threads = 3\n")
    assert off.budget().runner_threads == 3


def test_each_process_class_has_its_own_priority_and_none_is_idle_by_default() -> None:
    assert [priority_class(n) for n in ("extract", "background-gana", "embed", "runner")] \
        == ["producer", "producer", "embed", None]
    cfg = load_config_text("")
    assert (cfg.device.background_priority, cfg.device.background_nice) == ("nice", 10)
    assert cfg.device.embed_priority == "none"  # the pool answers the user's apps
    with pytest.raises(ConfigError, match="embed_priority"):
        load_config_text("[device]\nembed_priority = \"low\"\n")
    with pytest.raises(ConfigError, match="power_poll_s"):
        load_config_text("[device]\npower_poll_s = 0\n")


@pytest.mark.parametrize("mode", ["idle", "nice"])
def test_a_background_process_lowers_itself_and_status_can_tell(mode: str) -> None:
    code = ("import os, sys, time\nfrom uniun.runtime.device import lower_priority\n"
            f"print(lower_priority({mode!r}, 7), flush=True)\nsys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        got = proc.stdout.readline().strip()
        assert got == describe(proc.pid)
        assert got in ("SCHED_IDLE", "nice 7") if mode == "idle" else got == "nice 7"
        assert describe(os.getpid()) != got  # this test process was left alone
    finally:
        proc.stdin.close()
        proc.wait(10)
