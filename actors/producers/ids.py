"""Producer job ids that no other client of the scheduler can guess.

Every client of the scheduler shares one space of job ids, and a job id is taken by
whoever submits it first: another job under it is refused (``invalid_field job_id``).
An id another client could compute (``nataraj-7``, ``gana-digest-120000``, an
extraction's hash of a note path) is one it could take before the producer does, for
every id the producer will use. So a producer's id is what the job is, plus a random
tag; it is made once per job and persisted before the submit (``jobs.py``, rule 1),
so a restarted producer sends or attaches the same id and never remakes it.
"""

from __future__ import annotations

import secrets

__all__ = ["TAG_BYTES", "unguessable_id"]

TAG_BYTES = 8  # random bytes in a producer job id's tag: 64 bits no client can guess


def unguessable_id(stable: str) -> str:
    """``stable`` (what the job is: ``nataraj-7``), a dash and a random hex tag."""
    return f"{stable}-{secrets.token_hex(TAG_BYTES)}"
