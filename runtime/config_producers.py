"""The ``[producers]`` section of the runtime's configuration (docs/producers.md).

Apart from ``config_sections.py`` (which lists it with the other sections) because the
producers' settings are many and are theirs alone. As there, the ``doc`` metadata of
each field is the single source of its reference text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ProducersConfig"]


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


@dataclass(frozen=True)
class ProducersConfig:
    """Which producer processes the supervisor runs (chat is the CLI, not a process).

    All on by default, with sample notes and Ganas on a first start, so that a newcomer's
    ``start`` shows extraction, the deck and Ganas working (docs/producers.md).
    """

    extract: bool = field(default=True, metadata=_doc(
        "run the knowledge-extraction producer (default true)"))
    nataraj: bool = field(default=True, metadata=_doc(
        "run the Nataraj deck producer (default true)"))
    gana: bool = field(default=True, metadata=_doc(
        "run the Gana cron producer (default true)"))
    background_gana: bool = field(default=True, metadata=_doc(
        "run the background-Gana process (default true)"))
    # The producers' own settings (docs/producers.md).
    samples: bool = field(default=True, metadata=_doc(
        "first start: write sample notes and two sample Ganas if the notes folder and "
        "ganas.toml do not exist yet (default true)"))
    notes_dir: str = field(default="", metadata=_doc(
        "folder the extract producer watches for .md/.txt notes (default $UNIUN_HOME/notes)"))
    ganas_file: str = field(default="", metadata=_doc(
        "the Gana definitions (default $UNIUN_HOME/ganas.toml)"))
    scan_interval_s: float = field(default=2.0, metadata=_doc(
        "seconds between scans of the notes folder (default 2.0)"))
    backfill_per_s: float = field(default=1.0, metadata=_doc(
        "notes of the existing backlog submitted for extraction per second (default 1.0)"))
    extract_in_flight: int = field(default=8, metadata=_doc(
        "extraction jobs open in the scheduler at most (default 8)"))
    extract_max_new_tokens: int = field(default=256, metadata=_doc(
        "max_new_tokens of an extraction job (default 256: room for the answer schema's "
        "bounds)"))
    extract_format: bool = field(default=True, metadata=_doc(
        "extraction jobs ask for the answer's JSON schema, enforced by constrained decoding "
        "(default true; false: free text, parsed leniently)"))
    extract_model: str = field(default="", metadata=_doc(
        "model of extraction jobs (default \"\" = models.chat_model)"))
    deck_low: int = field(default=3, metadata=_doc(
        "Nataraj refills the deck when fewer cards than this are ready or coming (default 3)"))
    deck_high: int = field(default=8, metadata=_doc(
        "... up to this many cards (default 8)"))
    card_max_new_tokens: int = field(default=64, metadata=_doc(
        "max_new_tokens of a card job (default 64)"))
    nataraj_model: str = field(default="", metadata=_doc(
        "model of card jobs (default \"\" = models.chat_model)"))
    nataraj_prompt: str = field(default="auto", metadata=_doc(
        "card prompt style: \"chat\" (messages, for instruct models), \"completion\" "
        "(few-shot raw text, for base models such as gemma3-270m), or \"auto\": completion "
        "when the card model has no chat template (default auto)"))
    check_interval_s: float = field(default=1.0, metadata=_doc(
        "seconds between a producer's checks for due Ganas and deck refills (default 1.0)"))
    gana_lead_s: float = field(default=60.0, metadata=_doc(
        "a Gana fire is submitted this many seconds before its time, with deadline = its "
        "time (default 60.0)"))
    lifecycle_poll_s: float = field(default=1.0, metadata=_doc(
        "seconds between polls of the scheduler's lifecycle by gana-cron and the "
        "background-Gana process (default 1.0)"))
    background_lease_s: float = field(default=30.0, metadata=_doc(
        "lease of a background Gana fire; a dead owner's fire is re-run after it "
        "(default 30.0)"))
    background_threads: int = field(default=1, metadata=_doc(
        "ONNX Runtime threads of the background-Gana process's own model, used when "
        "device.thread_budget is false (default 1)"))
