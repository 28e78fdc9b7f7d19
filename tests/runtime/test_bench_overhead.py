"""The observability bench's statistics: what its ratios say about a user's two runtimes."""

from __future__ import annotations

from uniun.runtime.bench.overhead import core_cost, paired_ratio


def test_a_paired_ratio_cancels_drift_that_falls_on_both_sides() -> None:
    # The machine slows down over the run; "on" is 5 % slower in every pair.
    off = [0.040 * (1 + i / 10) for i in range(20)]
    on = [x * 1.05 for x in off]
    ratio = paired_ratio(on, off)
    assert ratio is not None and abs(ratio["median"] - 1.05) < 1e-9
    assert abs(ratio["ci95"][0] - 1.05) < 1e-9 and abs(ratio["ci95"][1] - 1.05) < 1e-9
    assert ratio["pairs"] == 20


def test_a_noisy_ratio_gets_an_interval_around_it_and_missing_samples_are_skipped() -> None:
    off = [1.0] * 12
    on = [0.9, 1.1] * 6
    on[3] = None  # a chat too short to give a decode speed
    ratio = paired_ratio(on, off)
    assert ratio is not None and ratio["pairs"] == 11
    low, high = ratio["ci95"]
    assert low <= ratio["median"] <= high and low < 1.0 < high
    assert paired_ratio([None], [1.0]) is None


def test_recording_costs_the_scheduler_core_a_little_cpu_per_token_not_none() -> None:
    cost = core_cost(jobs=20, tokens=5, blocks=2)
    assert cost["us_per_start_on"] > 0 and cost["us_per_token_on"] > 0
    assert set(cost["samples"]) == {"on", "off"}
