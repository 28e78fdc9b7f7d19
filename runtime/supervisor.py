"""The supervisor: starts the runtime's processes, watches them, restarts them, stops them.

Theory of operation (Erlang's one-for-one supervisor, at the process level):

- Children start one at a time in dependency order (scheduler, runner, then the
  embedding pool and producers); the next one starts when the previous one sent its
  first heartbeat.
- A child that exits, or sends no heartbeat for ``missed_heartbeats`` intervals, or never
  beats within ``start_timeout_s``, is killed (its whole process group) and restarted
  alone. Restarts are rate-limited: more than ``max_restarts`` in ``restart_window_s``
  means something is broken for good, so everything stops with a message naming the
  child and its log, and the supervisor exits 1.
- SIGINT / SIGTERM / SIGHUP: children stop in reverse order (the runner last, so the
  scheduler can park the running job), SIGTERM first and SIGKILL after
  ``stop_grace_s``; the supervisor exits 0.
- No orphans: each child leads its own process group (so the terminal's Ctrl-C reaches
  only the supervisor, which then stops children in order, and a kill takes grandchildren
  too), and each child asks Linux for SIGKILL when the supervisor dies
  (``PR_SET_PDEATHSIG`` in ``runtime.process``).

Files in the run dir (0700): ``supervisor.lock`` (held with ``flock`` while running, so a
crashed runtime's lock is free again), ``supervisor.json`` (pid, state, children's pids;
``status`` and ``stop`` read it), ``effective.toml`` (the config every child loads),
``front.endpoint``. Lock and state files are :mod:`runtime.state`'s business.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger

from uniun.protocol.liveness import Liveness
from uniun.runtime import process as process_registry
from uniun.runtime.config import RuntimeConfig
from uniun.runtime.heartbeat import ENDPOINT_ENV, HeartbeatMonitor, supervisor_endpoint
from uniun.runtime.metrics_http import start_metrics
from uniun.runtime.paths import ensure_private_dir
from uniun.runtime.state import write_state

CHILDREN_ENV = "UNIUN_CHILDREN"  # test/debug hook: comma-separated list replacing the plan
_TICK_S = 0.1


def plan_children(config: RuntimeConfig) -> list[str]:
    """Which processes the runtime runs, in start order (``UNIUN_CHILDREN`` overrides)."""
    override = os.environ.get(CHILDREN_ENV, "").strip()
    if override:
        return [name.strip() for name in override.split(",") if name.strip()]
    names = ["scheduler", "runner"]
    if config.embed.enabled:
        # One pool process; it runs and restarts its own embed-0..N-1 workers, so that a
        # dead worker's in-flight request is re-run (actors/embedding/pool.py).
        names.append("embed")
    if config.http.enabled:
        names.append("http")  # the OpenAI-compatible gateway (runtime/http_main.py)
    producers = config.producers
    for flag, name in ((producers.extract, "extract"), (producers.nataraj, "nataraj"),
                       (producers.gana, "gana"),
                       (producers.background_gana, "background-gana")):
        if flag:
            names.append(name)
    return names


def stop_order(children: Sequence["Child"]) -> list["Child"]:
    """Reverse start order, with the runner moved last (see :meth:`Supervisor.stop_all`)."""
    return sorted(reversed(children), key=lambda c: c.name == "runner")


class RestartLimiter:
    """At most ``max_restarts`` restarts in any ``window_s`` seconds (pure; clock passed in)."""

    def __init__(self, max_restarts: int, window_s: float) -> None:
        self.max_restarts = max_restarts
        self.window_s = window_s
        self._times: deque[float] = deque()

    def allow(self, now: float) -> bool:
        """Record a restart at ``now`` if allowed; False means the limit is reached."""
        while self._times and now - self._times[0] > self.window_s:
            self._times.popleft()
        if len(self._times) >= self.max_restarts:
            return False
        self._times.append(now)
        return True

    def recent(self, now: float) -> int:
        """Restarts within the window before ``now`` (drives the back-off)."""
        return sum(1 for t in self._times if now - t <= self.window_s)


def restart_backoff(child: "Child", now: float, healthy_after_s: float) -> float:
    """Seconds to wait before restarting ``child``, which failed at ``now``.

    None after a healthy life (up ``healthy_after_s`` or more since its first beat: one
    SIGKILL after a quiet hour must not cost seconds); else 0.25, 0.5, 1, 2 s for the 1st,
    2nd, 3rd, 4th+ quick failure in a row. Back-off is for crash loops only.
    """
    healthy = child.up_since is not None and now - child.up_since >= healthy_after_s
    child.quick_failures = 0 if healthy else child.quick_failures + 1
    child.up_since = None
    if child.quick_failures == 0:
        return 0.0
    return min(0.25 * 2 ** (child.quick_failures - 1), 2.0)


@dataclass
class Child:
    """One supervised process and what the supervisor knows about it."""

    name: str
    proc: subprocess.Popen[bytes] | None = None
    spawned_at: float = 0.0
    last_beat: float | None = None
    restart_at: float | None = None  # set while waiting out the back-off
    up_since: float | None = None  # first heartbeat of the current incarnation
    quick_failures: int = 0  # failures in a row, each after less than healthy_after_s up
    restarts: int = 0
    ever_spawned: bool = False
    exit_codes: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def up(self) -> bool:
        return self.proc is not None and self.last_beat is not None


class Supervisor:
    """Runs ``children`` under ``config``; :meth:`run` blocks and returns the exit code."""

    def __init__(self, config: RuntimeConfig, children: Sequence[str], *,
                 config_file: Path) -> None:
        unknown = [n for n in children if not process_registry.is_known(n)]
        if unknown:
            raise ValueError(f"unknown process(es): {', '.join(unknown)}")
        self.config = config
        self.config_file = config_file
        self.children = [Child(name) for name in children]
        sup = config.supervisor
        self.limiter = RestartLimiter(sup.max_restarts, sup.restart_window_s)
        self.liveness = sup.liveness
        self.endpoint = supervisor_endpoint(config.run_dir)
        self._stop_signal: int | None = None
        self._fatal: str | None = None
        self._state = "starting"
        self._child_env: dict[str, str | None] = {}

    # --- main loop -------------------------------------------------------------------

    def run(self) -> int:
        ensure_private_dir(self.config.run_dir)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        monitor = HeartbeatMonitor(self.endpoint)
        metrics = self.config.metrics
        gateway = any(c.name == "http" for c in self.children)  # it serves /metrics then
        self._child_env, server = start_metrics(self.config.run_dir, enabled=metrics.enabled,
                                                host=metrics.host, port=metrics.port,
                                                serve=not gateway,
                                                allowed_hosts=self.config.http.allowed_hosts)
        logger.info("supervisor {} up; children in order: {}", os.getpid(),
                    ", ".join(c.name for c in self.children))
        try:
            while self._stop_signal is None and self._fatal is None:
                came_up = False
                for beat in monitor.poll(_TICK_S):
                    came_up |= self._on_beat(beat.name, beat.pid, beat.at, beat.quiet_s)
                self._tick(time.monotonic(), changed=came_up)
        finally:
            self._state = "stopping"
            self._publish()
            self.stop_all()
            monitor.close()
            if server is not None:
                server.stop()
        if self._fatal is not None:
            logger.error("{}", self._fatal)
            print(f"uniun-runtime: {self._fatal}", file=sys.stderr)
            return 1
        logger.info("stopped on {}", signal.Signals(self._stop_signal or 15).name)
        return 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self._stop_signal is None:
            self._stop_signal = signum

    def _on_beat(self, name: str, pid: int, at: float, quiet_s: float = 0.0) -> bool:
        """Record a beat; True if it is the child's first (it just came up).

        A beat announcing ``quiet_s`` (a model load ahead) counts as heard that much
        later, so the silence it announced is not taken for a hang; an ordinary beat does
        not shorten it (protocol/liveness.py). The price: a hang inside the announced
        window is seen when the window ends.
        """
        for child in self.children:
            if child.name == name and child.pid == pid:
                first = child.last_beat is None
                if first:
                    logger.info("{} is up (pid {})", name, pid)
                    child.up_since = at
                if quiet_s:
                    logger.info("{} announces up to {:g} s without heartbeats", name, quiet_s)
                child.last_beat = Liveness.heard(at, quiet_s, previous=child.last_beat)
                return first
        return False

    def _tick(self, now: float, *, changed: bool = False) -> None:
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restart_at = None
                    self._spawn(child, now)
                    changed = True
                continue
            if child.proc is None:
                continue
            reason = self._failure(child, now)
            if reason is not None:
                self._on_failure(child, reason, now)
                changed = True
                if self._fatal:
                    return
        changed |= self._start_next(now)
        if self._state == "starting" and all(c.up for c in self.children):
            self._state = "running"
            logger.info("runtime running")
            changed = True
        if changed:
            self._publish()

    def _start_next(self, now: float) -> bool:
        """Spawn the first never-started child once every earlier one is up."""
        for child in self.children:
            if not child.ever_spawned:
                self._spawn(child, now)
                return True
            if not child.up:
                return False
        return False

    def _failure(self, child: Child, now: float) -> str | None:
        assert child.proc is not None
        code = child.proc.poll()
        if code is not None:
            child.exit_codes.append(code)
            return f"exited with code {code}" if code >= 0 else \
                f"was killed by {signal.Signals(-code).name}"
        if child.last_beat is None:
            if now - child.spawned_at > self.config.supervisor.start_timeout_s:
                return f"sent no heartbeat within {self.config.supervisor.start_timeout_s:g} s"
        elif self.liveness.dead(child.last_beat, now):
            return f"sent no heartbeat for {now - child.last_beat:.1f} s"
        return None

    def _on_failure(self, child: Child, reason: str, now: float) -> None:
        log = self.config.logs_dir / f"{child.name}.log"
        logger.warning("{} (pid {}) {}; see {}", child.name, child.pid, reason, log)
        self._kill(child, graceful=False)
        recent = self.limiter.recent(now)
        delay = self._backoff(child, now)
        if not self.limiter.allow(now):
            sup = self.config.supervisor
            self._fatal = (f"{child.name} failed {sup.max_restarts + 1} times within "
                           f"{sup.restart_window_s:g} s (last: {reason}); stopping the "
                           f"runtime. See {log}")
            return
        child.restarts += 1
        logger.info("restarting {} in {:.2f} s (restart {} within the window)",
                    child.name, delay, recent + 1)
        child.restart_at = now + delay

    def _backoff(self, child: Child, now: float) -> float:
        return restart_backoff(child, now, self.config.supervisor.healthy_after_s)

    # --- processes -------------------------------------------------------------------

    def _spawn(self, child: Child, now: float) -> None:
        env = dict(os.environ)
        env.update({ENDPOINT_ENV: self.endpoint, process_registry.PARENT_ENV: str(os.getpid()),
                    "UNIUN_HOME": str(self.config.home)})
        for key, value in self._child_env.items():  # the metrics folder (metrics_http.py)
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        log = self.config.logs_dir / f"{child.name}.out"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:  # stray prints and tracebacks; loguru has NAME.log
            child.proc = subprocess.Popen(
                [sys.executable, "-m", "uniun.runtime.process", child.name,
                 "--config", str(self.config_file)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True, env=env)
        child.spawned_at = now
        child.ever_spawned = True
        child.last_beat = None
        logger.info("spawned {} (pid {})", child.name, child.proc.pid)

    def _kill(self, child: Child, *, graceful: bool) -> None:
        """Stop ``child``'s process group: SIGTERM + grace when ``graceful``, then SIGKILL."""
        proc = child.proc
        if proc is None:
            return
        if graceful and proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.config.supervisor.stop_grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("{} did not stop within {:g} s; killing it", child.name,
                               self.config.supervisor.stop_grace_s)
        _signal_group(proc.pid, signal.SIGKILL)  # also sweeps grandchildren left behind
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
            logger.error("{} (pid {}) survived SIGKILL", child.name, proc.pid)
        child.proc = None
        child.last_beat = None

    def stop_all(self) -> None:
        """Stop every child, last started first, except that the runner goes last.

        The scheduler parks the running job while it stops, and parking needs a live
        runner: stopping the runner first would turn a graceful stop into a failure
        (a chat would see ``runner_failed``, a background job would lose its snapshot).
        """
        for child in stop_order(self.children):
            child.restart_at = None
            if child.proc is not None:
                logger.info("stopping {} (pid {})", child.name, child.pid)
                self._kill(child, graceful=True)

    def _publish(self) -> None:
        write_state(self.config.run_dir, {
            "pid": os.getpid(), "state": self._state,
            "front": self.config.front.endpoint, "policy": self.config.policy.name,
            "children": {c.name: c.pid for c in self.children},
            "up": {c.name: c.up for c in self.children},
            "restarts": {c.name: c.restarts for c in self.children},
        })


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
