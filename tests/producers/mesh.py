"""A real runtime with producers, for the producers' end-to-end tests.

``uniun-runtime start --config FILE`` over a private home: supervisor, scheduler,
runner and the producer processes, real sockets, the tiny model. ``Wire`` is a raw
DEALER that logs every message in arrival order (for event order across jobs). Waits
are generous and nothing asserts on timing: a loaded 2-core machine is slow.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import zmq

from uniun.runtime.results import ResultsStore

WAIT_S = 120.0

BASE = """\
[models]
chat_model = "tiny-1"

[supervisor]
heartbeat_interval_s = 1.0
missed_heartbeats = 6
stop_grace_s = 6
"""


def wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT_S,
             every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


class Wire:
    """One DEALER speaking raw protocol maps; ``log`` holds every message received."""

    _ids = itertools.count(1)

    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.log: list[dict[str, Any]] = []

    def close(self) -> None:
        self.sock.close(0)

    def send(self, mtype: str, **body: Any) -> str:
        msg_id = f"w{next(self._ids)}"
        self.sock.send(msgpack.packb({"v": 1, "type": mtype, "id": msg_id, **body}))
        return msg_id

    def pump(self, timeout: float) -> None:
        if self.sock.poll(int(timeout * 1000)):
            while True:
                try:
                    self.log.append(msgpack.unpackb(self.sock.recv(zmq.NOBLOCK), raw=False))
                except zmq.Again:
                    return

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float = WAIT_S) -> dict:
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for msg in self.log[seen:]:
                if pred(msg):
                    return msg
            seen = len(self.log)
            if time.monotonic() > deadline:
                raise AssertionError(f"no matching message; last: {self.log[-5:]}")
            self.pump(0.2)

    def request(self, mtype: str, timeout: float = WAIT_S, **body: Any) -> dict[str, Any]:
        msg_id = self.send(mtype, **body)
        return self.wait(lambda m: m.get("re") == msg_id, timeout)

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return [m for m in self.log if m.get("job_id") == job_id and "re" not in m]

    def end(self, job_id: str, timeout: float = WAIT_S) -> dict[str, Any]:
        return self.wait(lambda m: m.get("job_id") == job_id and "re" not in m
                         and m["type"] in ("done", "error"), timeout)


class Mesh:
    """A runtime over ``home``; ``config`` is TOML text appended to :data:`BASE`."""

    def __init__(self, home: Path, config: str = "") -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.config_path = home / "uniun.toml"
        self.config_path.write_text(BASE + config)
        self.env = dict(os.environ, UNIUN_HOME=str(home))
        self.env.pop("UNIUN_CHILDREN", None)
        self.endpoint = f"ipc://{home / 'run' / 'front.sock'}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.wires: list[Wire] = []

    def start(self) -> Mesh:
        out = open(self.home / "start.out", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uniun.runtime", "start", "--config", str(self.config_path)],
            env=self.env, stdout=out, stderr=subprocess.STDOUT)

        def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.logs()
            st = self.status(timeout=2.0)
            return bool(st and st.get("runner", {}).get("up"))
        wait_for("the runtime to serve", up)
        return self

    def wire(self) -> Wire:
        w = Wire(self.endpoint)
        self.wires.append(w)
        return w

    def status(self, timeout: float = 10.0) -> dict[str, Any] | None:
        w = Wire(self.endpoint)
        try:
            return w.request("status", timeout=timeout)
        except AssertionError:
            return None
        finally:
            w.close()

    def lifecycle(self, state: str) -> None:
        w = self.wire()
        assert w.request("lifecycle", state=state)["type"] == "ok"

    def store(self) -> ResultsStore:
        return ResultsStore(self.home / "results.db")

    def cli(self, *args: str, timeout: float = WAIT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "uniun.runtime", *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def pid(self, name: str) -> int | None:
        try:
            state = json.loads((self.home / "run" / "supervisor.json").read_text())
        except (OSError, ValueError):
            return None
        pid = state.get("children", {}).get(name)
        return pid if isinstance(pid, int) else None

    def kill(self, name: str) -> None:
        """SIGKILL a child and wait until the supervisor runs a new one."""
        old = self.pid(name)
        assert old is not None, f"no {name} running"
        os.kill(old, signal.SIGKILL)
        wait_for(f"a new {name}", lambda: self.pid(name) not in (None, old))

    def logs(self, names: tuple[str, ...] = ("extract", "nataraj", "gana", "background-gana",
                                               "scheduler", "supervisor")) -> str:
        parts = []
        for name in ("start.out", *(f"logs/{n}.log" for n in names)):
            path = self.home / name
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-25:]
                parts.append(f"--- {name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop(self) -> int | None:
        for w in self.wires:
            w.close()
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
