"""Prompt passes sized in time (``models/pass_budget.py``): pure, the rate injected."""

from __future__ import annotations

import pytest

from uniun.models.pass_budget import MIN_PASS_POSITIONS, PrefillRate, pass_positions


@pytest.mark.parametrize(("seconds_per_position", "positions"), [
    (0.0005, 100),  # a small model: 100 positions are 50 ms
    (0.002, 25),
    (0.03, 2),  # a big one: one position is 30 ms, but a pass feeds at least two
    (5.0, MIN_PASS_POSITIONS),
])
def test_a_pass_is_about_the_target_time_at_the_rate_given(
        seconds_per_position: float, positions: int) -> None:
    assert pass_positions(seconds_per_position, target_s=0.05, first=16,
                          ceiling=256) == positions


def test_a_fast_model_is_capped_and_an_unknown_rate_probes_with_the_first_size() -> None:
    assert pass_positions(1e-6, target_s=0.05, first=16, ceiling=256) == 256
    assert pass_positions(None, target_s=0.05, first=16, ceiling=256) == 16
    assert pass_positions(None, target_s=0.05, first=1, ceiling=256) == MIN_PASS_POSITIONS


def test_a_target_of_zero_turns_the_time_bound_off() -> None:
    assert pass_positions(5.0, target_s=0.0, first=16, ceiling=64) == 64
    assert pass_positions(5.0, target_s=0.0, first=16, ceiling=1) == MIN_PASS_POSITIONS


def test_the_rate_follows_the_passes_it_is_told_about() -> None:
    rate = PrefillRate(weight=0.5)
    assert rate.seconds_per_position is None
    rate.observe(1, 1.0)  # one position is a decode-sized pass, not prefill: ignored
    rate.observe(10, 0.0)  # an untimed pass: ignored
    assert rate.seconds_per_position is None and rate.passes == 0
    rate.observe(100, 0.1)
    assert rate.seconds_per_position == pytest.approx(0.001)
    rate.observe(100, 0.3)  # slower now (a longer context, a busier machine)
    assert rate.seconds_per_position == pytest.approx(0.002)
    sizes = []
    for _ in range(12):  # it keeps getting slower: the passes shrink toward 50 ms at 0.01
        rate.observe(10, 0.1)
        sizes.append(pass_positions(rate.seconds_per_position, target_s=0.05, first=16,
                                    ceiling=256))
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 5
    rate.reset()
    assert rate.seconds_per_position is None and rate.passes == 0
