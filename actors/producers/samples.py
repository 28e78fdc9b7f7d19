"""A newcomer's first run: sample notes and two sample Ganas, written once.

Decision (docs/producers.md): samples come with the *default* config, not a ``--demo``
flag. A person who just typed the README's ``start`` expects to see the runtime do
something — extraction, a deck filling, Ganas firing — without first learning where
notes and Ganas live. The samples are written only when the notes folder, or
``ganas.toml``, does not exist at all, so a user who deletes them does not get them
back, and a user with their own notes is never touched. ``[producers] samples = false``
turns this off.
"""

from __future__ import annotations

from pathlib import Path

from loguru import logger

SAMPLE_NOTES: dict[str, str] = {
    "welcome.md": (
        "# Welcome to UNIUN\n\n"
        "UNIUN runs one small language model on this machine and shares it between chat "
        "and background work. Drop Markdown or text notes into this folder: the extract "
        "producer reads each one, asks the model for the people, places and ideas in it, "
        "and stores them. `uniun-runtime results --kind knowledge` shows what it found.\n"),
    "ada-lovelace.md": (
        "# Ada Lovelace\n\n"
        "Ada Lovelace worked with Charles Babbage on the Analytical Engine in London. "
        "In 1843 she published notes describing an algorithm for computing Bernoulli "
        "numbers, often called the first computer program.\n"),
    "trip-to-lisbon.md": (
        "# Trip to Lisbon\n\n"
        "Maria and I take the train to Lisbon in May. We want to see the Belem Tower, "
        "eat pasteis de nata in Belem, and ride tram 28 up to the Alfama district.\n"),
    "garden.txt": (
        "Garden plan: tomatoes along the south fence, basil next to the tomatoes, "
        "and beans on the trellis. Water every morning in July.\n"),
    "reading-list.md": (
        "# Reading list\n\n"
        "- Dune by Frank Herbert\n- The Left Hand of Darkness by Ursula K. Le Guin\n"
        "- Gödel, Escher, Bach by Douglas Hofstadter\n"),
}

SAMPLE_GANAS = """\
# Ganas: small agent tasks the runtime fires on a schedule (docs/producers.md).
# id: letters, digits, '_', '-', '.'; every_minutes: interval; optional model_id,
# max_new_tokens (default 128) and system (a system message).

[[gana]]
id = "daily-tip"
prompt = "Give me one short, practical productivity tip for today."
every_minutes = 30
max_new_tokens = 64

[[gana]]
id = "word-of-the-day"
prompt = "Pick an interesting English word, define it, and use it in one sentence."
every_minutes = 60
max_new_tokens = 64
"""


def _write_new(path: Path, text: str) -> bool:
    try:
        with path.open("x", encoding="utf-8") as out:
            out.write(text)
    except FileExistsError:
        return False
    return True


def ensure_samples(notes_dir: Path, ganas_file: Path) -> list[Path]:
    """Write the samples that are missing because their place does not exist yet."""
    written: list[Path] = []
    if not notes_dir.exists():
        notes_dir.mkdir(parents=True, exist_ok=True)
        for name, text in SAMPLE_NOTES.items():
            if _write_new(notes_dir / name, text):
                written.append(notes_dir / name)
    if not ganas_file.exists():
        ganas_file.parent.mkdir(parents=True, exist_ok=True)
        if _write_new(ganas_file, SAMPLE_GANAS):
            written.append(ganas_file)
    if written:
        logger.info("first run: wrote {} sample file(s) ({} notes folder, {})", len(written),
                    notes_dir, ganas_file)
    return written
