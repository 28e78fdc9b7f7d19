"""The Nataraj producer: keeps the deck of generated cards between its water marks.

Each check it counts the cards in the deck (``deck_cards`` not yet taken) and the card
jobs still open, and submits as many ``nataraj`` jobs as :func:`cards_to_request` says.
Job ids are ``nataraj-<n>-<tag>``: ``n`` one more than the jobs this producer ever
persisted, and a random tag so that no other client can take the id first
(``ids.py``). Each is persisted before it is submitted, so it is stable
across restarts (a restarted producer re-attaches its open jobs through the tracker, and
counts them, instead of asking again). Reading the deck (``uniun-runtime deck --take
N``) is what makes room for new cards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from uniun.actors.producers.deck import (
    CARD_STOP,
    DEFAULT_TOPICS,
    WaterMarks,
    card_messages,
    card_prompt,
    cards_to_request,
    completion_card,
    pick_topic,
    tidy_card,
)
from uniun.actors.producers.ids import unguessable_id
from uniun.actors.producers.jobs import JobTracker
from uniun.actors.producers.results import ResultsStore

NAME = "nataraj"


@dataclass(frozen=True)
class NatarajSettings:
    marks: WaterMarks = field(default_factory=WaterMarks)
    check_interval_s: float = 2.0  # seconds between deck checks
    max_new_tokens: int = 64
    model_id: str | None = None  # None: the scheduler's default (chat) model
    topics: tuple[str, ...] = DEFAULT_TOPICS
    # "chat": messages for an instruct model; "completion": a few-shot raw prompt for a
    # base model (runtime/producers_main.py resolves the config's "auto").
    prompt_style: str = "chat"


def card_job(seq: int, settings: NatarajSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    topic = pick_topic(seq, settings.topics)
    job: dict[str, Any] = {"job_id": unguessable_id(f"{NAME}-{seq}"), "kind": "nataraj",
                           "max_new_tokens": settings.max_new_tokens}
    if settings.prompt_style == "completion":
        job.update(prompt=card_prompt(topic), stop=list(CARD_STOP))
    else:
        job["messages"] = card_messages(topic)
    if settings.model_id:
        job["model_id"] = settings.model_id
    return job, {"topic": topic, "style": settings.prompt_style}


def store_card(store: ResultsStore, row: dict[str, Any], done: dict[str, Any]) -> None:
    text = done.get("text", "")
    if row["meta"].get("style") == "completion":
        text = completion_card(text)
    text = tidy_card(text)
    log = logger.bind(job=row["job_id"])
    if text is None:
        log.info("card came back empty; not added")
        return
    if store.add_card(row["job_id"], row["meta"].get("topic"), text):
        log.info("card added to the deck ({} in deck)", store.deck_size())


class NatarajProducer:
    name = NAME

    def __init__(self, settings: NatarajSettings, store: ResultsStore,
                 tracker: JobTracker | None, *, now: float = 0.0) -> None:
        self.settings = settings
        self.store = store
        self.tracker = tracker
        self._next_check = now
        self.failures = 0  # consecutive failed card jobs: back off instead of hammering

    def on_error(self, row: dict[str, Any], event: dict[str, Any]) -> None:
        self.failures += 1
        logger.bind(job=row["job_id"]).warning("card job failed: {} {}", event.get("code"),
                                               event.get("message"))

    @classmethod
    def with_tracker(cls, settings: NatarajSettings, store: ResultsStore, client: Any,
                     **kwargs: Any) -> NatarajProducer:
        producer = cls(settings, store, None, **kwargs)

        def done(row: dict[str, Any], event: dict[str, Any]) -> None:
            producer.failures = 0
            store_card(store, row, event)

        producer.tracker = JobTracker(NAME, client, store, on_done=done,
                                      on_error=producer.on_error)
        return producer

    def next_seq(self) -> int:
        rows = self.store.query("SELECT count(*) FROM producer_jobs WHERE producer=?", (NAME,))
        return int(rows[0][0]) + 1

    def step(self, now: float) -> None:
        if now < self._next_check or self.tracker is None:
            return
        backoff = min(300.0, self.settings.check_interval_s * 2 ** min(self.failures, 10))
        self._next_check = now + (backoff if self.failures else self.settings.check_interval_s)
        self.tracker.sweep()
        in_flight = self.tracker.in_flight()
        wanted = cards_to_request(self.store.deck_size(), in_flight, self.settings.marks)
        for _ in range(wanted):
            job, meta = card_job(self.next_seq(), self.settings)
            self.tracker.add(job, meta)
        if wanted:
            logger.info("deck below {}: asked for {} card(s)", self.settings.marks.low, wanted)

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
