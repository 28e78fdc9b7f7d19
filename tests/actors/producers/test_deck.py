"""Nataraj's water marks and card tidying."""

from __future__ import annotations

import pytest

from uniun.actors.producers.deck import WaterMarks, cards_to_request, pick_topic, tidy_card


def test_deck_refills_to_high_only_once_below_low() -> None:
    marks = WaterMarks(low=3, high=8)
    assert cards_to_request(ready=0, in_flight=0, marks=marks) == 8
    assert cards_to_request(ready=2, in_flight=0, marks=marks) == 6
    assert cards_to_request(ready=3, in_flight=0, marks=marks) == 0  # at low: enough
    assert cards_to_request(ready=1, in_flight=5, marks=marks) == 0  # cards on their way


def test_simulated_reader_keeps_the_deck_between_the_marks() -> None:
    marks, ready, in_flight = WaterMarks(low=2, high=5), 0, 0
    for step in range(200):
        in_flight += cards_to_request(ready, in_flight, marks)
        if in_flight:  # one card finishes per step
            in_flight, ready = in_flight - 1, ready + 1
        if step % 3 == 0 and ready:  # the reader takes a card now and then
            ready -= 1
        assert ready + in_flight <= marks.high
    assert ready >= marks.low - 1


def test_bad_water_marks_are_refused() -> None:
    for low, high in [(0, 4), (5, 4), (-1, 2)]:
        with pytest.raises(ValueError, match="low"):
            WaterMarks(low, high)


def test_topics_rotate_and_cards_are_tidied() -> None:
    assert pick_topic(0, ("a", "b")) == "a" and pick_topic(3, ("a", "b")) == "b"
    assert tidy_card("  \n\nQ: x  \n\n A: y\n") == "Q: x\n A: y"
    assert tidy_card(" \n ") is None
    assert tidy_card("z" * 1000).endswith("…")
