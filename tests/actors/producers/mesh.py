"""A real runtime with producers, for the producers' end-to-end tests.

The integration harness's :class:`~integration.harness.Runtime` runs only scheduler and
runner; :class:`Mesh` is the same runtime with the whole mesh the config enables
(producers, embedding pool, background-Gana), the tiny model, and a few helpers for the
results store and the CLI. Waits are generous and nothing asserts on timing: a loaded
small machine is slow.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.harness import Runtime, Wire
from tests.wait import WAIT_S, wait_for
from uniun.actors.producers.results import ResultsStore
from uniun.actors.producers.results_fires import fires

__all__ = ["BASE", "Mesh", "settled_fires"]

BASE = """\
[models]
chat_model = "tiny-1"

[http]
port = 0

[supervisor]
heartbeat_interval_s = 1.0
missed_heartbeats = 6
stop_grace_s = 6
"""


class Mesh(Runtime):
    """A runtime over ``home``; ``config`` is TOML text appended to :data:`BASE`."""

    LOGGED = ("extract", "nataraj", "gana", "background-gana", "scheduler", "supervisor")

    def __init__(self, home: Path, config: str = "") -> None:
        super().__init__(home, BASE + config)
        self.env.pop("UNIUN_CHILDREN", None)  # every process the config enables

    @property
    def wires(self) -> list[Wire]:
        return self._wires

    def lifecycle(self, state: str) -> None:
        w = self.wire()
        assert w.request("lifecycle", state=state)["type"] == "ok"

    def store(self) -> ResultsStore:
        return ResultsStore(self.home / "results.db")

    def cli(self, *args: str, timeout: float = WAIT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "uniun.runtime", *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout)


def settled_fires(store: ResultsStore, gana_id: str,
                  timeout: float = WAIT_S) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One Gana's claims and scheduled runs, read at a moment they describe the same fires.

    The Ganas keep firing while a test reads: a claim, its run and its 'done' are
    separate writes, so claims read one query before the runs can miss (or show in
    flight) a fire the runs already hold. Read until every claim is done and there is
    one run per claim; a fire run twice never settles, and the wait names it.
    """
    def read() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        claims = fires(store, gana_id)
        runs = [r for r in store.gana_runs(gana_id) if r["slot"] is not None]
        if claims == fires(store, gana_id) and len(runs) == len(claims) and all(
                f["state"] == "done" for f in claims):
            return claims, runs
        return None

    return wait_for(f"{gana_id}'s claims and runs to agree", read, timeout=timeout)
