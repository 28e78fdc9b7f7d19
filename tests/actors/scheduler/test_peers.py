"""Which clients the front stops building replies for (pure, on a fake clock)."""

from __future__ import annotations

from tests.actors.policy.harness import FakeClock
from uniun.actors.scheduler.peers import MutedPeers

A, B = b"client-a", b"client-b"


def test_a_gone_client_is_muted_until_it_sends_again() -> None:
    peers = MutedPeers(FakeClock())
    assert peers.gone(A) and not peers.gone(A)  # the second report changes nothing
    assert peers.muted(A) and not peers.muted(B)
    peers.heard_from(A)
    assert not peers.muted(A)


def test_a_congested_client_is_muted_for_a_while_even_if_it_keeps_sending() -> None:
    clock = FakeClock()
    peers = MutedPeers(clock, congested_s=1.0)
    peers.congested(A)
    peers.heard_from(A)  # sending is not reading
    assert peers.muted(A)
    clock.advance(1.0)
    assert not peers.muted(A) and len(peers) == 0


def test_only_so_many_clients_are_remembered_the_oldest_forgotten() -> None:
    peers = MutedPeers(FakeClock(), remember=2)
    for conn in (A, B, b"client-c"):
        peers.gone(conn)
    assert len(peers) == 2 and not peers.muted(A) and peers.muted(b"client-c")
