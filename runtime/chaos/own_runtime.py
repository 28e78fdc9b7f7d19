"""A runtime of the chaos harness's own: ``uniun-runtime start`` over a temporary home.

Every process a user's runtime has, so each can be killed: scheduler, runner, the
embedding pool (2 workers), the extract, nataraj and gana producers and the
background-Gana process. The producers get no sample notes or Ganas (``samples =
false``), so the jobs in the ledger are the harness's; the HTTP gateway is off (it is
only a client of the front). The restart limiter is opened wide (a chaos run kills on
purpose; a crash loop still backs off) and everything else is the product default.
The model store is the user's (``$UNIUN_MODELS``, else ``$UNIUN_HOME/models``), shared.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from uniun.runtime.paths import models_dir
from uniun.runtime.state import read_state

__all__ = ["OwnRuntime", "own_config"]

START_WAIT_S = 300.0  # a first start may convert the model


def own_config(model: str, extra: str = "") -> str:
    return (f'[models]\nchat_model = "{model}"\n'
            '[producers]\nsamples = false\nextract = true\nnataraj = true\n'
            'gana = true\nbackground_gana = true\n'
            '[embed]\nenabled = true\nworkers = 2\n'
            '[http]\nenabled = false\n'
            '[supervisor]\nmax_restarts = 100000\n' + extra)


class OwnRuntime:
    """Start on ``__enter__`` (waits until running), SIGTERM on ``__exit__``."""

    def __init__(self, home: Path, model: str, extra_config: str = "",
                 children: tuple[str, ...] = ()) -> None:
        self.home, self.model = home, model
        self.children = children  # only these processes (UNIUN_CHILDREN); empty: all
        self.config = home / "chaos.toml"
        self.extra = extra_config
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    def __enter__(self) -> OwnRuntime:
        self.home.mkdir(parents=True, exist_ok=True)
        self.config.write_text(own_config(self.model, self.extra))
        # The user's model store, not one in the temporary home: converting the models
        # again for every run would take minutes.
        env = dict(os.environ, UNIUN_HOME=str(self.home), UNIUN_MODELS=str(models_dir()))
        for key in ("UNIUN_CONFIG", "UNIUN_CHILDREN"):
            env.pop(key, None)
        if self.children:
            env["UNIUN_CHILDREN"] = ",".join(self.children)
        with open(self.home / "start.out", "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uniun.runtime", "start", "--config", str(self.config)],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the runtime exited during start; see {self.home}/start.out")
            state = read_state(self.run_dir) or {}
            if state.get("state") == "running" and state.get("pid") == self.proc.pid:
                return self
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"the runtime did not come up; see {self.home}/logs")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
