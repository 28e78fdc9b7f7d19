"""The pool's counters and retry hint on their own (pure)."""

from __future__ import annotations

from uniun.actors.embedding.pool_state import RETRY_MAX_S, RETRY_MIN_S, Counters, ServiceTime


def test_a_result_adds_its_micro_batches_pauses_and_wait() -> None:
    counters = Counters()
    counters.add_result({"batches": 8, "pauses": 2, "pauses_within": 1, "waited_s": 0.25})
    counters.add_result({"batches": 1, "pauses": 0, "pauses_within": 0, "waited_s": 0.0})
    assert (counters.micro_batches, counters.yield_pauses, counters.yield_pauses_within) == (
        9, 2, 1)
    assert (counters.yielded, counters.yield_wait_s, counters.yield_wait_max_s) == (
        1, 0.25, 0.25)


def test_fields_a_worker_did_not_send_or_garbled_count_nothing() -> None:
    counters = Counters()
    counters.add_result({})  # a worker of an older version
    counters.add_result({"batches": True, "pauses": -1, "pauses_within": "2",
                         "waited_s": "long"})
    assert counters == Counters()


def test_the_retry_hint_follows_the_measured_run_time() -> None:
    service = ServiceTime()
    for _ in range(50):
        service.add(1.0)  # requests have been taking about a second
    assert abs(service.mean_s - 1.0) < 0.01
    # The line is full: one of two workers frees a slot in about half a run.
    assert abs(service.retry_after(workers=2, turns=1) - 0.5) < 0.01
    # This connection's cap: its turn comes after the 3 connections waiting have had theirs.
    assert abs(service.retry_after(workers=2, turns=3) - 1.5) < 0.02
    assert service.retry_after(workers=2, turns=0) == service.retry_after(workers=2, turns=1)


def test_the_retry_hint_stays_within_its_bounds() -> None:
    fast, slow = ServiceTime(), ServiceTime()
    for _ in range(100):
        fast.add(0.0)
        slow.add(1000.0)
    assert fast.retry_after(workers=2, turns=1) == RETRY_MIN_S
    assert slow.retry_after(workers=1, turns=50) == RETRY_MAX_S
