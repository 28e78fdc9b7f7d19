"""The faults: which, when (seeded), the signal itself, and when it counts as recovered.

Kinds (each only if its target runs; the supervisor's ``supervisor.json`` and the
pool's ``embed.workers.json`` name the pids):

- ``kill:runner``, ``kill:scheduler``, ``kill:<producer>``, ``kill:background-gana``,
  ``kill:embed`` (the pool; its workers must die with it), ``kill:embed-worker`` --
  SIGKILL of that one process, as a crash would;
- ``stop:runner``, ``stop:scheduler`` -- SIGSTOP, and SIGCONT 0.5 to 5 s later (past
  the heartbeat liveness the supervisor replaces it first; the SIGCONT then finds it
  gone, which is fine);
- ``disconnect`` -- a client that leaves mid-stream (:mod:`.workload`).

Recovered: for the runner and the scheduler, the first token the clients receive after
the supervisor shows the process back (a new pid up, or the same one continued) -- the
user's "next token"; for every other process, the moment it is back. A fault that is not
recovered within ``recover_timeout_s`` is ``unrecovered``, which fails the verdict.
One fault at a time: the next is injected only after this one recovered.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uniun.actors.embedding.workers import read_pids
from uniun.runtime.state import read_state

__all__ = ["Fault", "FaultInjector", "available_kinds", "KIND_WEIGHTS"]

# Relative weights of the kinds the plan draws from: the runner and the scheduler are
# the processes whose death loses work if anything is wrong, so they are drawn most.
KIND_WEIGHTS = {"kill:runner": 4, "kill:scheduler": 3, "stop:runner": 1, "stop:scheduler": 1,
                "kill:embed": 1, "kill:embed-worker": 1, "disconnect": 1}
PRODUCERS = ("extract", "nataraj", "gana", "background-gana")
TOKEN_RECOVERY = ("runner", "scheduler")  # recovered = the next token after they are back


@dataclass
class Fault:
    """One injected fault and what came of it (times from the harness's clock)."""

    kind: str
    target: str  # process name (embed-1, runner, ...) or "client"
    pid: int | None
    at: float
    cont_at: float | None = None  # stop:*: when SIGCONT is due
    back_at: float | None = None  # the process is back (a new pid up, or continued)
    recovered_at: float | None = None
    note: str = ""

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.at

    def to_map(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "pid": self.pid,
                "at_s": round(self.at, 3),
                "recovery_s": None if self.recovery_s is None else round(self.recovery_s, 3),
                "note": self.note}


def available_kinds(state: dict[str, Any], workers: dict[str, int]) -> dict[str, int]:
    """The fault kinds possible against this runtime, with their weights."""
    children = state.get("children") or {}
    kinds: dict[str, int] = {}
    for kind, weight in KIND_WEIGHTS.items():
        target = kind.partition(":")[2]
        if kind == "disconnect" or target in children or \
                (target == "embed-worker" and workers and "embed" in children):
            kinds[kind] = weight
    for name in PRODUCERS:
        if name in children:
            kinds[f"kill:{name}"] = 1
    return kinds


class FaultInjector:
    """Draws, injects and follows one fault at a time. ``disconnect`` is the workload's
    (passed in as ``leave``: it returns a note, or raises)."""

    def __init__(self, run_dir: Path, rng: random.Random, leave: Callable[[], str], *,
                 recover_timeout_s: float = 60.0, only: tuple[str, ...] = ()) -> None:
        self.run_dir, self.rng, self.leave = run_dir, rng, leave
        self.only = only  # restrict the draw to these kinds (empty: all available)
        self.recover_timeout_s = recover_timeout_s
        self.faults: list[Fault] = []
        self.current: Fault | None = None

    @property
    def idle(self) -> bool:
        return self.current is None

    def inject(self, now: float) -> Fault:
        state = read_state(self.run_dir) or {}
        workers = read_pids(self.run_dir)
        kinds = available_kinds(state, workers)
        names = sorted(k for k in kinds if not self.only or k in self.only)
        if not names:
            raise RuntimeError(f"none of the fault kinds {self.only} is possible here "
                               f"(possible: {', '.join(sorted(kinds))})")
        kind = self.rng.choices(names, weights=[kinds[n] for n in names])[0]
        children = state.get("children") or {}
        action, _, target = kind.partition(":")
        if kind == "disconnect":
            fault = Fault(kind, "client", None, now)
            try:
                fault.note = f"job {self.leave()}"
                fault.recovered_at = now  # nothing to recover; the job's end is the check
            except TimeoutError as err:
                fault.note = str(err)
        else:
            pid: int | None
            if target == "embed-worker":
                target = self.rng.choice(sorted(workers))
                pid = workers[target]
            else:
                pid = children.get(target)
            fault = Fault(kind, target, pid, now)
            if isinstance(pid, int):
                _signal(pid, signal.SIGSTOP if action == "stop" else signal.SIGKILL)
                if action == "stop":
                    fault.cont_at = now + self.rng.uniform(0.5, 5.0)
            else:
                fault.note = "no pid"
                fault.recovered_at = now
        self.faults.append(fault)
        self.current = None if fault.recovered_at is not None else fault
        return fault

    def poll(self, now: float, last_token_at: float) -> Fault | None:
        """Follow the current fault; returns it once it is over (recovered or not)."""
        fault = self.current
        if fault is None:
            return None
        if fault.cont_at is not None and now >= fault.cont_at:
            assert fault.pid is not None
            _signal(fault.pid, signal.SIGCONT)
            fault.cont_at = None
            if fault.back_at is None and self._pid_of(fault.target) == fault.pid:
                fault.back_at = now  # continued before the supervisor gave up on it
        if fault.back_at is None:  # replaced by the supervisor?
            pid = self._pid_of(fault.target)
            if pid is not None and pid != fault.pid and self._up(fault.target):
                fault.back_at = now
        if fault.back_at is not None:
            if fault.target not in TOKEN_RECOVERY:
                fault.recovered_at = fault.back_at
            elif last_token_at > fault.back_at:
                fault.recovered_at = last_token_at
        if fault.recovered_at is None and now - fault.at > self.recover_timeout_s:
            fault.note = fault.note or f"not recovered within {self.recover_timeout_s:g} s"
        elif fault.recovered_at is None:
            return None
        self.current = None
        return fault

    def _pid_of(self, target: str) -> int | None:
        if target.startswith("embed-"):
            return read_pids(self.run_dir).get(target)
        pid = ((read_state(self.run_dir) or {}).get("children") or {}).get(target)
        return pid if isinstance(pid, int) else None

    def _up(self, target: str) -> bool:
        if target.startswith("embed-"):
            return True  # published = started by the pool
        return bool(((read_state(self.run_dir) or {}).get("up") or {}).get(target))


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
