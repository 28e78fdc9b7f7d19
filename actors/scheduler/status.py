"""The body of the ``status`` reply (docs/protocol.md, "status").

Pure: the core passes what it knows, the caller's ``processes`` map included (the
scheduler's own pid and those the supervisor published; the core reads no files), and
the databases this runtime found corrupt at start and moved aside, reported as
``quarantined`` while there are any, and the journal's dead letters (acknowledged jobs
a replay could not use), reported as ``dead_letters`` while there are any
(docs/protocol.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from uniun.actors.policy import PolicyBase
from uniun.actors.scheduler.jobs import JobTable
from uniun.protocol import runner_records as rp

__all__ = ["status_body", "redacted", "HIDDEN"]

HIDDEN = "(another key's job)"  # stands for a job id a keyed client may not see


def status_body(policy: PolicyBase, jobs: JobTable, runner: rp.Hello | None,
                snapshots: tuple[int, int], processes: dict[str, int], *,
                queue_cap: int, quarantined: Sequence[Mapping[str, Any]] = (),
                dead_letters: Mapping[str, Any] | None = None) -> dict[str, Any]:
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
    if quarantined:  # extension: databases found corrupt at start, moved aside
        body["quarantined"] = [dict(r) for r in quarantined]
    if dead_letters:  # extension: acknowledged jobs the journal replay moved aside
        body["dead_letters"] = dict(dead_letters)
    return body


def redacted(body: dict[str, Any], visible: Callable[[str], bool]) -> dict[str, Any]:
    """``body`` as a client with a CURVE key sees it: every job it may not see (another
    key's) keeps its place in the queues and its kind, but its id becomes :data:`HIDDEN`.
    Status carries no prompts, so ids are all there is to hide. ``body`` is not changed."""

    def job_id(value: Any) -> Any:
        return value if not isinstance(value, str) or visible(value) else HIDDEN

    out = dict(body)
    out["queues"] = {tier: [job_id(j) for j in ids]
                     for tier, ids in (body.get("queues") or {}).items()}
    for key in ("held", "fifo"):
        if isinstance(body.get(key), list):
            out[key] = [job_id(j) for j in body[key]]
    if isinstance(body.get("running"), dict):
        out["running"] = {**body["running"], "job_id": job_id(body["running"].get("job_id"))}
    for key in ("events", "poisoned"):
        out[key] = [{**item, "job_id": job_id(item.get("job_id"))}
                    if isinstance(item, dict) and item.get("job_id") is not None else item
                    for item in body.get(key) or []]
    if isinstance(body.get("dead_letters"), dict):
        dead = body["dead_letters"]
        out["dead_letters"] = {**dead, "recent": [{**d, "job_id": job_id(d.get("job_id"))}
                                                  for d in dead.get("recent") or []]}
    return out
