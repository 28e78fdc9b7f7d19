"""A real runtime for end-to-end tests: ``uniun-runtime start`` over a private home.

Everything is the product's own: the supervisor, the scheduler and runner processes,
ZeroMQ sockets, msgpack frames. :class:`Wire` is a deliberately dumb client (one DEALER,
raw protocol maps, a log of every message in arrival order) so tests can assert the
order of events across jobs and send malformed frames; tests that need reconnects use
the product's :class:`~uniun.protocol.client.Client`.

Every wait is generous (a loaded small machine is slow); nothing asserts on timing. A
long job is long by its token count at a fixed least pace per token (``TOKEN_PACE_S``),
so a fast machine cannot finish it before the test has preempted, cancelled or killed it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgpack
import zmq

from tests.wait import WAIT_S, wait_for
from uniun.protocol.curve import ClientCurve
from uniun.runtime.runner_main import TOKEN_PACE_ENV

BASE_CONFIG = """\
[models]
chat_model = "tiny-1"

[producers]
extract = false
nataraj = false
gana = false
background_gana = false

[embed]
enabled = false

[policy]
chat_idle_gap_s = 5.0

[supervisor]
heartbeat_interval_s = 1.0
missed_heartbeats = 5
stop_grace_s = 6
"""


PROMPT = "hello world"
# Every runtime a test starts makes at most one token per this many seconds (the runner's
# test hook, runtime/runner_main.py TOKEN_PACE_ENV): the tiny model alone makes a token
# in a fraction of a millisecond on a fast machine, and a job that has to outlast a
# slice, a deadline or a chat must do so by its token count, not by the machine being
# slow. Where the machine is slower than the pace, the pace costs nothing.
TOKEN_PACE_S = 0.001
LONG = 2500  # tokens: at least LONG_MIN_S of runner time, so there is time to preempt it
LONG_MIN_S = LONG * TOKEN_PACE_S


def long_job(job_id: str, kind: str, **extra: Any) -> dict[str, Any]:
    """A background job long enough to be preempted, cancelled or killed mid-way (it runs
    at least LONG_MIN_S on any machine)."""
    return {"job_id": job_id, "kind": kind, "prompt": PROMPT, "max_new_tokens": LONG, **extra}


def chat_job(job_id: str, **extra: Any) -> dict[str, Any]:
    return {"job_id": job_id, "kind": "chat", "max_new_tokens": 24,
            "messages": [{"role": "user", "content": "Hello! How are you?"}], **extra}


class Wire:
    """One DEALER connection speaking raw protocol maps; ``log`` holds every message."""

    _ids = itertools.count(1)

    def __init__(self, endpoint: str, curve: ClientCurve | None = None) -> None:
        self._ctx = zmq.Context.instance()
        self.sock = self._ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            curve.apply(self.sock)
        self.sock.connect(endpoint)
        self.log: list[dict[str, Any]] = []

    def close(self) -> None:
        self.sock.close(0)

    def send_raw(self, frame: bytes) -> None:
        self.sock.send(frame)

    def send(self, mtype: str, **body: Any) -> str:
        msg_id = f"m{next(self._ids)}"
        self.sock.send(msgpack.packb({"v": 1, "type": mtype, "id": msg_id, **body}))
        return msg_id

    def _receive(self, timeout: float) -> bool:
        if not self.sock.poll(int(timeout * 1000)):
            return False
        self.log.append(msgpack.unpackb(self.sock.recv(), raw=False))
        return True

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float = WAIT_S,
             *, start: int = 0) -> dict[str, Any]:
        """The first logged message (from index ``start``) matching ``pred``."""
        deadline = time.monotonic() + timeout
        seen = start
        while True:
            while seen < len(self.log):
                if pred(self.log[seen]):
                    return self.log[seen]
                seen += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching message; last ones: {self.log[-5:]}")
            self._receive(min(left, 0.5))

    def request(self, mtype: str, timeout: float = WAIT_S, **body: Any) -> dict[str, Any]:
        msg_id = self.send(mtype, **body)
        return self.wait(lambda msg: msg.get("re") == msg_id, timeout)

    def submit(self, job: dict[str, Any]) -> dict[str, Any]:
        return self.request("submit", job=job)

    def end(self, job_id: str, timeout: float = WAIT_S) -> dict[str, Any]:
        """The job's terminal event (done or error)."""
        return self.wait(lambda m: m.get("job_id") == job_id and "re" not in m
                         and m["type"] in ("done", "error"), timeout)

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return [m for m in self.log if m.get("job_id") == job_id and "re" not in m]

    def index(self, job_id: str, mtype: str, nth: int = 0, **match: Any) -> int:
        """Position in the log of the ``nth`` event of ``mtype`` for ``job_id``."""
        hits = [i for i, m in enumerate(self.log)
                if m.get("job_id") == job_id and "re" not in m and m["type"] == mtype
                and all(m.get(k) == v for k, v in match.items())]
        return hits[nth]


def wait_tokens(w: Wire, job_id: str, n: int = 3) -> None:
    """Until ``job_id`` has streamed at least ``n`` tokens (it is generating)."""
    w.wait(lambda m: m.get("job_id") == job_id and m["type"] == "token" and m["seq"] >= n - 1)


def tokens_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "token"]


def assert_gap_free(events: list[dict[str, Any]]) -> None:
    seqs = [e["seq"] for e in tokens_of(events)]
    assert seqs == list(range(len(seqs))), f"token seqs not 0..n-1: {seqs[:20]}..."


@contextlib.contextmanager
def serving(home: Path, config: str, children: str,
            env: Mapping[str, str] | None = None) -> Iterator[Runtime]:
    """A runtime of the processes ``children`` (``UNIUN_CHILDREN``) over ``home``, serving
    until the block ends; then stopped, its logs printed (pytest shows them with a
    failure) and its clean exit asserted."""
    runtime = Runtime(home, config)
    runtime.env["UNIUN_CHILDREN"] = children
    runtime.env.update(env or {})
    runtime.LOGGED = ("supervisor", *children.split(","))
    runtime.start()
    try:
        yield runtime
    finally:
        code = runtime.stop()
        print(runtime.logs())
        assert code == 0


class Runtime:
    """``python -m uniun.runtime start`` over ``home`` with ``config`` (TOML text)."""

    def __init__(self, home: Path, config: str = BASE_CONFIG) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.config_path = home / "uniun.toml"
        self.config_path.write_text(config)
        # Just the two processes under test: producers and the embedding pool would add
        # jobs and CPU load of their own (they have their own end-to-end tests).
        self.env = dict(os.environ, UNIUN_HOME=str(home), UNIUN_CHILDREN="scheduler,runner")
        self.env[TOKEN_PACE_ENV] = str(TOKEN_PACE_S)  # a test that needs another sets it
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoint = f"ipc://{home / 'run' / 'front.sock'}"
        self.curve: ClientCurve | None = None  # keys for a tcp front with CURVE
        self.umask = -1  # the umask ``start`` is launched with (-1: this process's)
        self._wires: list[Wire] = []

    def start(self) -> Runtime:
        with open(self.home / "start.out", "wb") as out:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uniun.runtime", "start", "--config",
                 str(self.config_path)],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, umask=self.umask)
        self.wait_serving()
        return self

    def wait_serving(self) -> dict[str, Any]:
        """Until the front answers and a runner has said hello."""
        def up() -> dict[str, Any] | None:
            assert self.proc is not None and self.proc.poll() is None, self.logs()
            st = self.status(timeout=2.0)
            return st if st and st.get("runner", {}).get("up") else None
        return wait_for("the runtime to serve with a runner", up)

    def gateway_url(self) -> str:
        """The HTTP gateway's base URL, once it serves (it writes run/http.endpoint)."""
        path = self.home / "run" / "http.endpoint"
        return str(wait_for("the gateway's endpoint file",
                            lambda: path.exists() and path.read_text().strip())).strip()

    def wire(self) -> Wire:
        w = Wire(self.endpoint, self.curve)
        self._wires.append(w)
        return w

    def status(self, timeout: float = 10.0) -> dict[str, Any] | None:
        w = Wire(self.endpoint, self.curve)
        try:
            return w.request("status", timeout=timeout)
        except AssertionError:
            return None
        finally:
            w.close()

    def pid(self, name: str) -> int | None:
        try:
            state = json.loads((self.home / "run" / "supervisor.json").read_text())
        except (OSError, ValueError):
            return None
        pid = state.get("children", {}).get(name)
        return pid if isinstance(pid, int) else None

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Signal a child; wait until the supervisor has a new one serving."""
        old = self.pid(name)
        assert old is not None
        os.kill(old, sig)
        wait_for(f"a new {name}", lambda: self.pid(name) not in (None, old))
        return old

    LOGGED: tuple[str, ...] = ("supervisor", "scheduler", "runner")  # tails in logs()

    def logs(self, names: tuple[str, ...] | None = None, lines_each: int = 40) -> str:
        """The tails of ``start.out`` and of each process's log, for failure messages."""
        parts = []
        for name in ("start.out", *(f"logs/{n}.log" for n in names or self.LOGGED)):
            path = self.home / name
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-lines_each:]
                parts.append(f"--- {name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop(self) -> int | None:
        for w in self._wires:
            w.close()
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
