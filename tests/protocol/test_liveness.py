"""The one liveness rule, and the quiet period a beat may announce (a model load ahead)."""

from __future__ import annotations

import msgpack

from uniun.protocol.liveness import MAX_QUIET_S, Liveness
from uniun.runtime.heartbeat import _parse


def test_a_peer_is_dead_after_misses_intervals_of_silence() -> None:
    rule = Liveness(interval_s=1.0, misses=3)
    assert not rule.dead(10.0, 13.0)
    assert rule.dead(10.0, 13.01)


def test_an_announced_quiet_period_extends_the_allowed_silence() -> None:
    rule = Liveness(interval_s=1.0, misses=3)
    heard = Liveness.heard(10.0, 60.0)
    assert not rule.dead(heard, 72.0)
    assert rule.dead(heard, 73.5)


def test_a_bad_quiet_value_counts_as_none_and_a_huge_one_is_capped() -> None:
    for bad in ("60", None, -5, True, float("nan"), [1]):
        assert Liveness.heard(10.0, bad) == 10.0
    assert Liveness.heard(10.0, 1e12) == 10.0 + MAX_QUIET_S


def test_the_supervisor_reads_quiet_s_from_a_beat_and_tolerates_junk() -> None:
    beat = _parse(msgpack.packb({"type": "heartbeat", "name": "runner", "pid": 7,
                                 "quiet_s": 120.0}))
    assert beat is not None and beat.quiet_s == 120.0
    junk = _parse(msgpack.packb({"type": "heartbeat", "name": "runner", "pid": 7,
                                 "quiet_s": "forever"}))
    assert junk is not None and junk.quiet_s == 0.0  # still a beat, without the quiet


def test_an_ordinary_beat_does_not_shorten_an_announced_silence() -> None:
    """A beat can leave between the announcement and the load it announced; ending the
    allowance then would restart the runner mid-load."""
    announced = Liveness.heard(100.0, 12.0)
    assert Liveness.heard(100.1, previous=announced) == 112.0
    assert not Liveness(0.2, 8).dead(Liveness.heard(100.1, previous=announced), 110.0)
    assert Liveness.heard(120.0, previous=announced) == 120.0  # after it, beats count again
