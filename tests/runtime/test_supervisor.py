"""The supervisor, with real processes: fake children registered only by this test.

Children come from ``fake_children.py`` (loaded through ``UNIUN_PROCESS_PLUGINS``, chosen
through ``UNIUN_CHILDREN``); the supervisor, the lock, the heartbeats and the signals
are the product's own. Every wait is generous; nothing asserts on timing.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.wait import WAIT_S, wait_for
from uniun.runtime.supervisor import Child, RestartLimiter, restart_backoff, stop_order

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent


def alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


class Runtime:
    """One ``uniun-runtime start`` process over a private home."""

    def __init__(self, home: Path, children: str) -> None:
        self.home = home
        self.config = home / "uniun.toml"
        self.config.parent.mkdir(parents=True, exist_ok=True)
        # Fast beats, yet 1.6 s of silence before "dead": a busy small machine can
        # delay a healthy child's beat well past 3 intervals.
        self.config.write_text("[supervisor]\nheartbeat_interval_s = 0.2\n"
                               "missed_heartbeats = 8\n"
                               "stop_grace_s = 2\nrestart_window_s = 120\n")
        self.env = dict(os.environ, UNIUN_HOME=str(home), UNIUN_CHILDREN=children,
                        UNIUN_PROCESS_PLUGINS="fake_children",
                        PYTHONPATH=os.pathsep.join(filter(None, [
                            str(HERE), os.environ.get("PYTHONPATH", "")])))
        self.proc: subprocess.Popen[str] | None = None

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "uniun.runtime", *args,
                               "--config", str(self.config)],
                              env=self.env, capture_output=True, text=True, timeout=WAIT_S * 2)

    def start(self) -> Runtime:
        self.proc = subprocess.Popen([sys.executable, "-m", "uniun.runtime", "start",
                                      "--config", str(self.config)],
                                     env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        return self

    def state(self) -> dict:
        try:
            return json.loads((self.home / "run" / "supervisor.json").read_text())
        except (OSError, ValueError):
            return {}

    def running(self) -> dict:
        return wait_for("the runtime to run", lambda: self.state().get("state") == "running"
                        and self.state())  # type: ignore[return-value]

    def wait(self) -> tuple[int, str]:
        assert self.proc is not None
        out, _ = self.proc.communicate(timeout=WAIT_S * 2)
        return self.proc.returncode, out

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.communicate(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Callable[[str], Runtime]]:
    made: list[Runtime] = []

    def make(children: str) -> Runtime:
        rt = Runtime(tmp_path / f"h{len(made)}", children)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.kill()


def test_crash_looping_child_stops_the_runtime(runtime: Callable[[str], Runtime]) -> None:
    rt = runtime("fake-sleeper,fake-crasher").start()
    code, out = rt.wait()
    assert code != 0
    assert "fake-crasher failed 6 times" in out and "stopping the runtime" in out
    assert not (rt.home / "run" / "supervisor.json").exists()


def test_killed_child_is_restarted(runtime: Callable[[str], Runtime]) -> None:
    rt = runtime("fake-sleeper,fake-parent").start()
    first = rt.running()["children"]["fake-sleeper"]
    os.kill(first, signal.SIGKILL)
    state = wait_for("a new fake-sleeper", lambda: (s := rt.state()).get("state") == "running"
                     and s["children"]["fake-sleeper"] not in (None, first) and s)
    assert state["restarts"]["fake-sleeper"] == 1  # type: ignore[index]
    assert alive(state["children"]["fake-sleeper"])  # type: ignore[index]


def test_silent_child_is_declared_dead_and_restarted(runtime: Callable[[str], Runtime]) -> None:
    rt = runtime("fake-hanger").start()
    frozen = int(wait_for("the hanger to freeze",
                          lambda: (p := rt.home / "fake-hanger.froze").exists()
                          and p.read_text()))  # type: ignore[arg-type]
    state = wait_for("a new fake-hanger", lambda: (s := rt.state()).get("state") == "running"
                     and s["children"]["fake-hanger"] not in (None, frozen) and s)
    assert state["restarts"]["fake-hanger"] == 1  # type: ignore[index]
    wait_for("the frozen hanger to be killed", lambda: not alive(frozen))
    log = (rt.home / "logs" / "supervisor.log").read_text()
    assert "sent no heartbeat" in log


def test_hung_main_loop_stops_the_beats_and_is_restarted(
        runtime: Callable[[str], Runtime]) -> None:
    rt = runtime("fake-stuck").start()
    stuck = int(wait_for("the stuck child", lambda: (p := rt.home / "fake-stuck.stuck").exists()
                         and p.read_text()))  # type: ignore[arg-type]
    state = wait_for("a new fake-stuck", lambda: (s := rt.state()).get("up", {}).get(
        "fake-stuck") and s["children"]["fake-stuck"] not in (None, stuck) and s)
    assert state["restarts"]["fake-stuck"] == 1  # type: ignore[index]
    wait_for("the hung process to be killed", lambda: not alive(stuck))


def test_a_child_that_announces_a_silent_load_is_not_restarted(
        runtime: Callable[[str], Runtime]) -> None:
    """A runner loading a big tokenizer holds the GIL: no beats for seconds. Announced
    first, the silence is allowed; the control child holds it unannounced and is
    restarted, which shows the hold does stop the beats."""
    rt = runtime("fake-loader,fake-unannounced").start()
    first = rt.running()["children"]
    loaded = int(wait_for("the announced load", lambda: (
        p := rt.home / "fake-loader.loaded").exists() and p.read_text()))  # type: ignore[arg-type]
    assert loaded == first["fake-loader"]
    state = wait_for("the unannounced child's replacement", lambda: (
        s := rt.state()).get("restarts", {}).get("fake-unannounced") and s)
    assert state["restarts"]["fake-loader"] == 0  # type: ignore[index]
    assert state["children"]["fake-loader"] == loaded  # type: ignore[index]
    log = (rt.home / "logs" / "supervisor.log").read_text()
    assert "fake-loader announces up to 12 s without heartbeats" in log
    assert "fake-unannounced" in log and "sent no heartbeat" in log


def test_second_start_is_refused(runtime: Callable[[str], Runtime]) -> None:
    rt = runtime("fake-sleeper").start()
    before = rt.running()
    second = rt.cli("start")
    assert second.returncode == 1
    assert "already running" in second.stderr and str(before["pid"]) in second.stderr
    assert rt.state()["pid"] == before["pid"]
    assert alive(before["children"]["fake-sleeper"])


def test_stale_lock_of_a_dead_runtime_is_taken_over(runtime: Callable[[str], Runtime]) -> None:
    rt = runtime("fake-sleeper").start()
    dead = rt.running()
    os.kill(dead["pid"], signal.SIGKILL)  # no cleanup at all: files stay behind
    rt.wait()
    wait_for("the orphaned child to die with its parent",
             lambda: not alive(dead["children"]["fake-sleeper"]))
    assert (rt.home / "run" / "supervisor.json").exists()
    rt.start()
    fresh = wait_for("the new supervisor to run",
                     lambda: (s := rt.state()).get("pid") not in (None, dead["pid"])
                     and s.get("state") == "running" and s)
    assert alive(fresh["children"]["fake-sleeper"])  # type: ignore[index]


def test_stop_leaves_no_process_behind(runtime: Callable[[str], Runtime]) -> None:
    rt = runtime("fake-sleeper,fake-parent,fake-stubborn").start()
    state = rt.running()
    grandchild = int((rt.home / "fake-grandchild.pid").read_text())
    pids = [state["pid"], grandchild, *state["children"].values()]
    assert all(alive(p) for p in pids)
    stopped = rt.cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    code, out = rt.wait()
    assert code == 0
    wait_for("every process to be gone", lambda: not any(alive(p) for p in pids))
    assert "fake-stubborn did not stop" in out  # it ignored SIGTERM and got SIGKILL
    assert rt.cli("stop").returncode == 1  # nothing left to stop


def test_sigint_stops_children_in_reverse_order(runtime: Callable[[str], Runtime]) -> None:
    rt = runtime("fake-sleeper,fake-parent").start()
    rt.running()
    assert rt.proc is not None
    rt.proc.send_signal(signal.SIGINT)
    code, out = rt.wait()
    assert code == 0
    assert out.index("stopping fake-parent") < out.index("stopping fake-sleeper")


def test_run_dir_is_owner_only(runtime: Callable[[str], Runtime]) -> None:
    rt = runtime("fake-sleeper").start()
    rt.running()
    mode = stat.S_IMODE((rt.home / "run").stat().st_mode)
    assert mode == 0o700
    assert stat.S_IMODE((rt.home / "run" / "effective.toml").stat().st_mode) == 0o600


def test_unknown_child_is_a_clear_error(runtime: Callable[[str], Runtime]) -> None:
    result = runtime("fake-nonesuch").cli("start")
    assert result.returncode == 2 and "fake-nonesuch" in result.stderr


def test_restart_limiter_counts_a_sliding_window() -> None:
    limiter = RestartLimiter(max_restarts=2, window_s=10.0)
    assert limiter.allow(0.0) and limiter.allow(1.0)
    assert not limiter.allow(2.0)
    assert limiter.allow(11.5)  # the restart at 0.0 has left the window


def test_restart_after_a_healthy_life_is_immediate_and_a_crash_loop_backs_off() -> None:
    child = Child("runner", up_since=100.0)
    assert restart_backoff(child, 200.0, healthy_after_s=5.0) == 0.0  # healthy: at once
    delays = []
    for start in (201.0, 203.0, 205.0, 207.0, 209.0):  # each dies 1 s after its first beat
        child.up_since = start
        delays.append(restart_backoff(child, start + 1.0, healthy_after_s=5.0))
    assert delays == [0.25, 0.5, 1.0, 2.0, 2.0]
    child.up_since = 300.0
    assert restart_backoff(child, 310.0, healthy_after_s=5.0) == 0.0  # healthy again


def test_runner_stops_after_the_scheduler_so_the_running_job_can_be_parked() -> None:
    children = [Child(name) for name in ("scheduler", "runner", "embed", "extract")]
    assert [c.name for c in stop_order(children)] == ["extract", "embed", "scheduler", "runner"]
