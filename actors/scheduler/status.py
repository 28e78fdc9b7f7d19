"""The body of the ``status`` reply (PROTOCOL.md "status carries at least ...").

Pure: the core passes what it knows, the caller's ``processes`` map included (the
scheduler's own pid and those the supervisor published; the core reads no files). The
one fact from outside the core is set once, before the front opens: the databases this
runtime found corrupt at start and moved aside (:func:`note_quarantined`), reported as
``quarantined`` while there are any (docs/protocol.md).
"""

from __future__ import annotations

from typing import Any

from uniun.actors.policy import PolicyBase
from uniun.actors.scheduler.jobs import JobTable
from uniun.protocol import runner_records as rp

__all__ = ["note_quarantined", "status_body"]

# What this runtime moved aside at start ({file, moved_to, reason, at} each); set by the
# scheduler's main before any request can ask (runtime/quarantine.py).
_QUARANTINED: list[dict[str, Any]] = []


def note_quarantined(records: list[dict[str, Any]]) -> None:
    """Report ``records`` in every ``status`` from now on (replaces earlier ones)."""
    _QUARANTINED[:] = [dict(r) for r in records]


def status_body(policy: PolicyBase, jobs: JobTable, runner: rp.Hello | None,
                snapshots: tuple[int, int], processes: dict[str, int], *,
                queue_cap: int) -> dict[str, Any]:
    body = dict(policy.status())
    running = policy.running
    procs = dict(processes)
    if runner is not None:
        procs["runner"] = runner.pid
    body.update(
        loaded_model=policy.loaded_model,
        running=running.summary() if running is not None else None,
        snapshots={"count": snapshots[0], "bytes": snapshots[1]},
        processes=procs,
        # Ready: a chat sent now would be answered (the runner's Hello comes after its
        # model is loaded and warmed, so up with a model means a token is a pass away).
        runner={"up": runner is not None, "pid": runner.pid if runner else None,
                "ready": runner is not None and policy.loaded_model is not None},
        ready=runner is not None and policy.loaded_model is not None,
        jobs=len(jobs), queue_cap=queue_cap,
        poisoned=jobs.poisoned())  # extension: dead-lettered jobs (docs/protocol.md)
    if _QUARANTINED:  # extension: databases found corrupt at start, moved aside
        body["quarantined"] = [dict(r) for r in _QUARANTINED]
    return body
