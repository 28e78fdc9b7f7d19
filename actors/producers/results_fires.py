"""Gana fire claims in the results database: exactly-once firing across processes.

Two processes fire Ganas: gana-cron (through the scheduler, lifecycle ``foreground``)
and the background-Gana process (its own model session, lifecycle ``background``). The
lifecycle flips at any moment and either may be killed, so neither may trust its own
memory of "last fired". The database is the single source of truth:

- :func:`claim_fire` reads the last claimed slot and inserts the next due one in a single
  ``BEGIN IMMEDIATE`` transaction. Whoever commits first owns the slot; the other then
  sees it as the last slot and finds nothing due. A slot is claimed at most once
  (also enforced by the primary key), so no fire runs twice.
- A claim stays ``claimed`` until its run is recorded, and :func:`finish_fire` records the
  run and closes the claim in one transaction, so a killed owner leaves an open claim,
  never a lost one. gana-cron re-attaches its own open claims (the scheduler has the job);
  the background owner holds a *lease* it renews while generating; an open background
  claim whose lease ran out is adopted (:func:`adopt_expired`) by whichever side is active.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uniun.actors.producers.results import ResultsStore, insert_gana_run

OWNER_CRON = "cron"
OWNER_BACKGROUND = "background"


@dataclass(frozen=True)
class Fire:
    gana_id: str
    slot: float
    job_id: str
    owner: str


def _fire(row: Any) -> Fire:
    return Fire(row["gana_id"], row["slot"], row["job_id"], row["owner"])


def last_slot(store: ResultsStore, gana_id: str) -> float | None:
    rows = store.query("SELECT max(slot) FROM gana_fires WHERE gana_id=?", (gana_id,))
    return rows[0][0]


def claim_fire(store: ResultsStore, gana_id: str, *, owner: str,
               due: Callable[[float | None], float | None],
               job_id_for: Callable[[float], str],
               lease_s: float | None = None, now: float | None = None) -> Fire | None:
    """Claim the due slot of one Gana, or return None when nothing is due.

    ``due(last_slot)`` is the schedule (``gana_schedule.due_slot`` with the Gana's
    interval and the current time bound in); it runs inside the transaction.
    """
    now = time.time() if now is None else now
    with store.transaction() as conn:
        last = conn.execute("SELECT max(slot) FROM gana_fires WHERE gana_id=?",
                            (gana_id,)).fetchone()[0]
        slot = due(last)
        if slot is None:
            return None
        job_id = job_id_for(slot)
        lease = None if lease_s is None else now + lease_s
        conn.execute("INSERT INTO gana_fires (gana_id, slot, job_id, owner, state, claimed_at,"
                     " lease_until) VALUES (?,?,?,?,'claimed',?,?)",
                     (gana_id, slot, job_id, owner, now, lease))
    return Fire(gana_id, slot, job_id, owner)


def open_fires(store: ResultsStore, owner: str) -> list[Fire]:
    """Claims of ``owner`` not yet finished, oldest first."""
    rows = store.query("SELECT * FROM gana_fires WHERE owner=? AND state='claimed'"
                       " ORDER BY slot", (owner,))
    return [_fire(r) for r in rows]


def renew_lease(store: ResultsStore, job_id: str, lease_s: float,
                now: float | None = None) -> None:
    now = time.time() if now is None else now
    with store.transaction() as conn:
        conn.execute("UPDATE gana_fires SET lease_until=? WHERE job_id=? AND state='claimed'",
                     (now + lease_s, job_id))


def adopt_expired(store: ResultsStore, new_owner: str, *, lease_s: float | None = None,
                  now: float | None = None) -> list[Fire]:
    """Take over open background claims whose lease ran out (their owner died).

    gana-cron's claims carry no lease: their job sits in the scheduler's journal, and
    gana-cron re-attaches it, so nobody else may take them.
    """
    now = time.time() if now is None else now
    lease = None if lease_s is None else now + lease_s
    with store.transaction() as conn:
        rows = conn.execute(
            "SELECT * FROM gana_fires WHERE state='claimed' AND owner=? AND lease_until < ?"
            " ORDER BY slot", (OWNER_BACKGROUND, now)).fetchall()
        conn.executemany("UPDATE gana_fires SET owner=?, lease_until=? WHERE job_id=?",
                         [(new_owner, lease, r["job_id"]) for r in rows])
    return [Fire(r["gana_id"], r["slot"], r["job_id"], new_owner) for r in rows]


def finish_fire(store: ResultsStore, fire: Fire, run: dict[str, Any] | None,
                *, failed: str | None = None) -> None:
    """Record the run (if any) and close the claim, atomically."""
    with store.transaction() as conn:
        if run is not None:
            insert_gana_run(conn, {**run, "job_id": fire.job_id, "gana_id": fire.gana_id,
                                   "slot": fire.slot})
        conn.execute("UPDATE gana_fires SET state=?, done_at=? WHERE job_id=?",
                     ("failed" if failed else "done", time.time(), fire.job_id))


def fires(store: ResultsStore, gana_id: str | None = None) -> list[dict[str, Any]]:
    """All claims (for tests and ``status``-style listings)."""
    if gana_id is None:
        rows = store.query("SELECT * FROM gana_fires ORDER BY gana_id, slot")
    else:
        rows = store.query("SELECT * FROM gana_fires WHERE gana_id=? ORDER BY slot", (gana_id,))
    return [dict(r) for r in rows]
