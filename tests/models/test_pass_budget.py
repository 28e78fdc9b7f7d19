"""Prompt passes sized in time (``models/pass_budget.py``): pure, the costs injected."""

from __future__ import annotations

import pytest

from uniun.models.pass_budget import MIN_PASS_POSITIONS, PassCost, pass_positions


@pytest.mark.parametrize(("per_position_s", "positions"), [
    (0.0005, 100),  # a small model: 100 positions are 50 ms
    (0.002, 25),
    (0.03, 2),  # a big one: one position is 30 ms, but a pass feeds at least two
    (5.0, MIN_PASS_POSITIONS),
])
def test_a_pass_is_about_the_target_time_at_the_cost_given(
        per_position_s: float, positions: int) -> None:
    assert pass_positions(per_position_s, target_s=0.05, floor=2, ceiling=256) == positions


def test_the_overhead_counts_against_the_target() -> None:
    # 6 ms per pass whatever its length (SmolLM2's decode step), 0.5 ms a position.
    assert pass_positions(0.0005, overhead_s=0.006, target_s=0.05, floor=2,
                          ceiling=256) == 88


def test_a_pass_is_never_mostly_overhead() -> None:
    """A 3B model here: a 200 ms decode step, 28 ms a position. Passes sized to 50 ms
    would be two positions at decode speed; 80 % of a pass goes to positions instead."""
    n = pass_positions(0.028, overhead_s=0.2, target_s=0.05, floor=2, ceiling=256)
    assert n == int(4 * 0.2 / 0.028) == 28
    assert n * 0.028 / (0.2 + n * 0.028) >= 0.79
    assert pass_positions(0.028, overhead_s=0.2, target_s=0.05, floor=2, ceiling=256,
                          min_efficiency=0.5) == 7


def test_a_fast_model_is_capped_and_an_unknown_cost_probes_with_the_first_size() -> None:
    assert pass_positions(1e-6, target_s=0.05, floor=2, ceiling=256) == 256
    assert pass_positions(None, target_s=0.05, floor=16, ceiling=256) == 16
    assert pass_positions(None, target_s=0.05, floor=1, ceiling=256) == MIN_PASS_POSITIONS


def test_a_target_of_zero_turns_the_time_bound_off() -> None:
    assert pass_positions(5.0, target_s=0.0, floor=2, ceiling=64) == 64
    assert pass_positions(5.0, target_s=0.0, floor=2, ceiling=1) == MIN_PASS_POSITIONS


def test_the_costs_follow_the_passes_they_are_told_about() -> None:
    cost = PassCost(weight=0.5)
    assert cost.per_position_s is None
    cost.observe(1, 1.0)  # one position is a decode-sized pass, not prefill: ignored
    cost.observe(10, 0.0)  # an untimed pass: ignored
    assert cost.per_position_s is None and cost.passes == 0
    cost.observe(100, 0.1)
    assert cost.per_position_s == pytest.approx(0.001)
    cost.observe(100, 0.3)  # slower now (a longer context, a busier machine)
    assert cost.per_position_s == pytest.approx(0.002)
    cost.observe_step(0.01)
    cost.observe_step(0.03)
    assert cost.overhead_s == pytest.approx(0.02)
    cost.observe(100, 0.02)  # no slower than the overhead: positions are not free
    assert cost.per_position_s == pytest.approx((0.002 + 0.00002) / 2)
    sizes = []
    for _ in range(12):  # it keeps getting slower: the passes shrink toward 50 ms
        cost.observe(10, 0.02 + 10 * 0.005)
        sizes.append(pass_positions(cost.per_position_s, overhead_s=cost.overhead_s,
                                    target_s=0.05, floor=2, ceiling=256))
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 16  # 4 x overhead / cost
    cost.reset()
    assert (cost.per_position_s, cost.overhead_s, cost.passes) == (None, 0.0, 0)


def test_the_floor_holds_whatever_the_costs_say() -> None:
    """A misjudged overhead (it grows with the context; decode steps measure it) must not
    shrink passes to decode speed: the floor is the least a pass feeds."""
    assert pass_positions(0.03, target_s=0.05, floor=16, ceiling=256) == 16
    assert pass_positions(0.0005, target_s=0.05, floor=16, ceiling=256) == 100
    assert pass_positions(0.03, target_s=0.05, floor=500, ceiling=256) == 256
