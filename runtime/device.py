"""The OS side of scheduling the whole device (docs/device.md).

Two things the kernel and ONNX Runtime do better than any signal of ours:

- **CPU priority, per process class** (:func:`priority_class`). A background process
  yields to the *user*, not to the world: the scheduler already preempts background
  generation for chat at the next token, so the OS priority only has to keep the
  producers' own Python below the user's programs, not below every program. The
  producers (``extract``, ``nataraj``, ``gana``, ``background-gana``) run at ``nice 10``
  by default (``device.background_priority``); the embedding pool and its workers, which
  answer the user's own apps, at normal priority (``device.embed_priority``), so an
  unrelated ``make`` cannot starve the pool's start or a request (the yield signal keeps
  them out of a chat's way). ``SCHED_IDLE`` stays available
  (``idle``) for a machine with nothing else on it. If lowering is refused the process
  says so and runs at normal priority. The scheduler, the runner, the gateway and the
  supervisor keep normal priority. :func:`describe` reads any process's priority back,
  for ``status``.
- **Thread budget.** The runner's intra-op threads, each embedding worker's threads and
  the background-Gana session's threads are chosen together from the core count
  (:func:`thread_budget`, pure), so the sessions never ask for more threads than there
  are cores; threads off the runner never spin.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from loguru import logger

__all__ = ["BACKGROUND", "EMBED", "PRODUCERS", "lower_priority", "priority_class",
           "describe", "ThreadBudget", "thread_budget"]

# Process names (base names, see runtime.process.base_name) by priority class.
PRODUCERS = frozenset({"extract", "nataraj", "gana", "background-gana"})
EMBED = frozenset({"embed"})
BACKGROUND = PRODUCERS | EMBED  # every process that runs below the runner
PRIORITIES = ("idle", "nice", "none")


def priority_class(name: str) -> str | None:
    """``"producer"``, ``"embed"`` or ``None`` (normal priority) for a process base name."""
    if name in PRODUCERS:
        return "producer"
    if name in EMBED:
        return "embed"
    return None


def lower_priority(mode: str = "idle", nice: int = 10) -> str:
    """Lower this process's CPU priority; return what it got (e.g. ``"SCHED_IDLE"``)."""
    if mode not in PRIORITIES:
        raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, not {mode!r}")
    if mode == "none":
        return describe(os.getpid())
    if mode == "idle" and hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return describe(os.getpid())
        except OSError as err:
            logger.warning("SCHED_IDLE not allowed ({}); trying nice {}", err, nice)
    try:
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if current < nice:
            os.nice(nice - current)
    except (OSError, AttributeError) as err:
        logger.warning("cannot lower the CPU priority ({}); running at normal priority", err)
    return describe(os.getpid())


def describe(pid: int) -> str:
    """``"SCHED_IDLE"``, ``"nice 10"``, ``"normal"`` or ``"?"`` (gone, unreadable)."""
    try:
        policy = os.sched_getscheduler(pid)
        nice = os.getpriority(os.PRIO_PROCESS, pid)
    except (OSError, AttributeError):
        return "?"
    if policy == getattr(os, "SCHED_IDLE", -1):
        return "SCHED_IDLE"
    if policy == getattr(os, "SCHED_BATCH", -1):
        return f"SCHED_BATCH nice {nice}"
    return f"nice {nice}" if nice else "normal"


@dataclass(frozen=True)
class ThreadBudget:
    """ONNX Runtime threads per session, chosen together (see :func:`thread_budget`)."""

    cores: int
    runner_threads: int
    runner_spinning: bool
    embed_threads: int  # per embedding worker; never spinning
    background_threads: int  # the background-Gana session; never spinning


def thread_budget(cores: int, *, embed_workers: int, runner_spinning: bool = True,
                  runner_threads: int = 0, embed_threads: int = 0,
                  background_threads: int = 0) -> ThreadBudget:
    """The runner gets the cores (at most 8, keeping 2 for the rest from 5 cores on);
    the embedding workers share what is left, one thread each at least; an explicit
    (non-zero) figure wins. On 2 cores: runner 2, each worker 1, background-Gana 1.

    Why the runner gets every core even though the workers need some: the workers
    yield to interactive work (and the producers run niced), so while a chat runs the
    cores are the runner's; when it does not, the kernel hands idle cores to the workers.
    """
    cores = max(1, cores)
    runner = runner_threads or (cores if cores <= 4 else min(8, cores - 2))
    spare = max(0, cores - runner)
    workers = max(1, embed_workers)
    embed = embed_threads or max(1, spare // workers)
    background = background_threads or max(1, min(embed, 2))
    return ThreadBudget(cores=cores, runner_threads=runner, runner_spinning=runner_spinning,
                        embed_threads=embed, background_threads=background)
