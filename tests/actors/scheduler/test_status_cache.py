"""``status`` under a flood: one snapshot serves every request while nothing changes, and
the processes' files are read at most once per interval; any change shows at once."""

from __future__ import annotations

from tests.actors.policy.harness import FakeClock, spec
from uniun.actors.policy import make_policy
from uniun.actors.scheduler.core import SchedulerCore
from uniun.actors.scheduler.core_requests import PROCESSES_REUSE_S, STATUS_REUSE_S
from uniun.protocol import requests as rq

A, B = b"client-a", b"client-b"


class Reads:
    """Counts how often the core asks for the processes (each ask reads files)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> dict[str, int]:
        self.count += 1
        return {"scheduler": 1}


def core_with(clock: FakeClock, reads: Reads) -> SchedulerCore:
    policy = make_policy("uniun", None, clock, wall_clock=clock)
    return SchedulerCore(policy=policy, queue_cap=100, clock=clock, wall=clock,
                         processes=reads, segments=False, metrics=False)


def status(core: SchedulerCore, conn: bytes, n: int) -> dict:
    fx = core.request(conn, rq.StatusRequest(f"st-{n}"))
    (send,) = fx.sends
    assert send.msg["re"] == f"st-{n}"
    return send.msg


def test_a_thousand_status_requests_read_the_processes_once() -> None:
    clock, reads = FakeClock(), Reads()
    core = core_with(clock, reads)
    replies = [status(core, A, n) for n in range(1000)]
    assert reads.count == 1
    assert all(r["queues"] == replies[0]["queues"] for r in replies)
    clock.advance(max(STATUS_REUSE_S, PROCESSES_REUSE_S))
    status(core, A, 1000)
    assert reads.count == 2


def test_a_submit_shows_in_the_next_status_even_within_the_interval() -> None:
    clock, reads = FakeClock(), Reads()
    core = core_with(clock, reads)
    assert status(core, A, 0)["jobs"] == 0
    core.request(B, rq.Submit("s-1", spec("bg-1", "nataraj")))
    after = status(core, A, 1)
    assert after["jobs"] == 1 and "bg-1" in after["queues"]["T4"]
    assert reads.count == 1  # the body was rebuilt; the processes' files were not reread
