"""The pool's waiting line on its own: round-robin by connection, the two caps, a dead
worker's request first again, a gone peer's requests dropped."""

from __future__ import annotations

import pytest

from uniun.actors.embedding.fair_queue import FairQueue, Refusal


def _fill(queue: FairQueue[str], key: str, n: int) -> None:
    for i in range(n):
        assert queue.refusal(key) is None
        queue.push(key, f"{key}{i}")


def test_connections_take_turns_instead_of_arrival_order() -> None:
    queue: FairQueue[str] = FairQueue(bound=100)
    _fill(queue, "flood", 6)  # one connection queues six before the others send anything
    _fill(queue, "a", 2)
    _fill(queue, "b", 1)
    taken = [queue.pop() for _ in range(len(queue))]
    assert taken == ["flood0", "a0", "b0", "flood1", "a1", "flood2", "flood3", "flood4",
                     "flood5"]
    assert not queue and queue.connections == 0


def test_a_connection_that_arrives_later_waits_one_turn_at_most() -> None:
    queue: FairQueue[str] = FairQueue(bound=100)
    _fill(queue, "flood", 10)
    assert queue.pop() == "flood0"
    _fill(queue, "late", 1)
    assert [queue.pop(), queue.pop()] == ["flood1", "late0"]


def test_one_connection_is_refused_at_its_cap_while_others_still_fit() -> None:
    queue: FairQueue[str] = FairQueue(bound=10, per_client=3)
    _fill(queue, "flood", 3)
    assert queue.refusal("flood") == Refusal("client", 3)
    assert queue.refusal("other") is None
    queue.pop()  # one of the flood's requests is taken: it has room for one more
    assert queue.refusal("flood") is None


def test_the_total_bound_holds_across_connections() -> None:
    queue: FairQueue[str] = FairQueue(bound=4, per_client=3)
    _fill(queue, "a", 3)
    _fill(queue, "b", 1)
    assert queue.refusal("c") == Refusal("total", 4)
    assert queue.refusal("a") == Refusal("client", 3)  # its own cap is reported first


def test_no_per_client_cap_when_zero() -> None:
    queue: FairQueue[str] = FairQueue(bound=5, per_client=0)
    _fill(queue, "a", 5)
    assert queue.refusal("a") == Refusal("total", 5)


def test_a_requeued_request_goes_first_and_its_connection_next() -> None:
    queue: FairQueue[str] = FairQueue(bound=10)
    _fill(queue, "a", 2)
    _fill(queue, "b", 2)
    assert queue.pop() == "a0"
    assert queue.pop() == "b0"
    queue.push_front("a", "a0")  # a0's worker died
    assert [queue.pop() for _ in range(len(queue))] == ["a0", "b1", "a1"]  # then b's turn
    queue.push_front("gone-quiet", "x")  # a connection with nothing waiting
    assert queue.pop() == "x" and not queue


def test_dropping_a_gone_peer_removes_only_its_requests() -> None:
    queue: FairQueue[str] = FairQueue(bound=10)
    _fill(queue, "a", 3)
    _fill(queue, "b", 2)
    assert queue.drop("a") == ["a0", "a1", "a2"]
    assert queue.drop("nobody") == []
    assert len(queue) == 2 and queue.waiting("a") == 0 and queue.connections == 1
    assert list(queue) == ["b0", "b1"]
    assert [queue.pop(), queue.pop()] == ["b0", "b1"]
    with pytest.raises(IndexError):
        queue.pop()


def test_negative_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        FairQueue(bound=-1)
    with pytest.raises(ValueError):
        FairQueue(bound=1, per_client=-1)
