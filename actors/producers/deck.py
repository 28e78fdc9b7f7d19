"""Nataraj's deck: when to generate cards, what to ask for, how to tidy the answer.

The deck is kept between a low and a high water mark with hysteresis: nothing is
generated while at least ``low`` cards are ready or on their way; once fewer are, enough
jobs are submitted to come back up to ``high``. Counting jobs in flight as cards keeps a
slow runner from being flooded with duplicate requests. Pure functions, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TOPICS: tuple[str, ...] = (
    "a surprising fact about octopuses", "why the sky is blue", "the history of zero",
    "how bees communicate", "a tip for better sleep", "the water cycle",
    "a famous bridge", "how vaccines train the body", "the speed of light",
    "a useful kitchen trick", "the tallest mountain", "how a rainbow forms",
)
MAX_CARD_CHARS = 600


@dataclass(frozen=True)
class WaterMarks:
    low: int = 3   # refill when fewer than this many cards are ready or in flight
    high: int = 8  # ... up to this many

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(f"need 1 <= low <= high, got low={self.low}, high={self.high}")


def cards_to_request(ready: int, in_flight: int, marks: WaterMarks) -> int:
    """How many card jobs to submit now."""
    have = ready + in_flight
    if have >= marks.low:
        return 0
    return max(0, marks.high - have)


def pick_topic(seq: int, topics: tuple[str, ...] = DEFAULT_TOPICS) -> str:
    """Topics rotate, so a refill of several cards asks for different ones."""
    if not topics:
        raise ValueError("no topics")
    return topics[seq % len(topics)]


def card_messages(topic: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You write short, friendly flashcards."},
        {"role": "user", "content": f"Write one flashcard about {topic}. "
                                    "Two lines: 'Q: ...' then 'A: ...'. No other text."},
    ]


# A base model (no chat template, e.g. Gemma 3 270M) continues text instead of answering:
# two worked cards, then the topic and "Q:", and the model writes the third card. The job
# stops at the blank line that would start a fourth; :func:`completion_card` puts the
# "Q:" back.
CARD_FEW_SHOT = (
    "Flashcards. Each has a question line and an answer line.\n\n"
    "Topic: the Moon\nQ: How long does the Moon take to orbit the Earth?\n"
    "A: About 27 days.\n\n"
    "Topic: photosynthesis\nQ: Which gas do plants take in for photosynthesis?\n"
    "A: Carbon dioxide.\n\n")
CARD_STOP = ("\n\n", "\nTopic:")


def card_prompt(topic: str) -> str:
    """The completion-style card prompt (few-shot) for base models."""
    return f"{CARD_FEW_SHOT}Topic: {topic}\nQ:"


def completion_card(text: str) -> str:
    """A base model's continuation of :func:`card_prompt` as the card's two lines."""
    return "Q:" + text.split("\n\n", 1)[0].split("\nTopic:", 1)[0]


def tidy_card(text: str) -> str | None:
    """The card text as shown, or None when the model produced nothing usable."""
    cleaned = "\n".join(line.rstrip() for line in text.strip().splitlines() if line.strip())
    if not cleaned:
        return None
    if len(cleaned) > MAX_CARD_CHARS:
        cleaned = cleaned[:MAX_CARD_CHARS].rstrip() + "…"
    return cleaned
