"""Rules for reusing what a runner already holds: parked states and spill files.

Pure functions beside :mod:`uniun.actors.runner.jobs`, so its command handlers read as
the steps they take. The rule they serve: a job continues after exactly the tokens the
scheduler streamed — from a snapshot whose ids *begin with* those tokens (any extra ids,
generated while the scheduler was down, are forgotten and the resume trims the KV), from
a spill file a killed runner left behind, or by recompute.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loguru import logger

from uniun.models.generate import Generation
from uniun.models.kv import ParkedState

__all__ = ["continues", "already_done", "peek_progress", "find_orphans"]

_MAGIC = b"UNIUNKV1"  # models/kv.py's spill-file format: magic, u32 header length, JSON


def continues(state: ParkedState, model_id: str, tokens: Sequence[int], text: str) -> bool:
    """Can ``state`` continue a job after ``tokens`` (streamed as ``text``) on ``model_id``?

    Yes if it is on that model and its generated ids begin with ``tokens``; then ids
    beyond them are dropped from the state, so a resume continues right after ``tokens``.
    """
    p = state.progress
    tokens = list(tokens)
    if p.model_id != model_id or p.generated_ids[:len(tokens)] != tokens:
        return False
    if len(p.generated_ids) > len(tokens):
        p.generated_ids = tokens
        p.text = text
        p.finished, p.finish_reason = False, None
    return True


def already_done(gen: Generation) -> str | None:
    """A finish reason if the ids already streamed complete the job, else None (a runner
    can die between its last token and its Finished report)."""
    p = gen.progress
    if p.generated_ids and p.generated_ids[-1] in p.eos_ids:
        return "stop"
    if len(p.generated_ids) >= p.max_new_tokens:
        return "length"
    return None


def peek_progress(path: Path) -> dict[str, Any] | None:
    """The progress record in a ``.kvsnap`` header, without reading the KV payload."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_MAGIC) + 4)
            if len(head) < len(_MAGIC) + 4 or head[:len(_MAGIC)] != _MAGIC:
                return None
            (length,) = struct.unpack("<I", head[len(_MAGIC):])
            header = json.loads(f.read(length))
        progress = header.get("progress")
        return progress if isinstance(progress, dict) else None
    except (OSError, ValueError):
        return None


def find_orphans(spill_dir: Path) -> dict[str, Path]:
    """Spill files a previous runner process left, by job id; unreadable ones are removed."""
    found: dict[str, Path] = {}
    if not spill_dir.is_dir():
        return found
    for path in sorted(spill_dir.glob("*.kvsnap")):
        record = peek_progress(path)
        job_id = record.get("job_id") if record else None
        if isinstance(job_id, str):
            found[job_id] = path
        else:
            path.unlink(missing_ok=True)
    if found:
        logger.info("found {} spilled snapshots of a previous runner", len(found))
    return found
