"""Which model ids a job may name: the decoders in the store that can run jobs.

The front validates every submit against it; a miss asks the store again (a model
imported while the runtime runs becomes usable at once), a hit is remembered.
"""

from __future__ import annotations

from uniun.models.convert.recipes import can_run_jobs
from uniun.models.store import ModelStore

__all__ = ["ModelIds"]


class ModelIds:
    """``model_id in ModelIds(store)``: a decoder a job can run on (see ``can_run_jobs``)."""

    def __init__(self, store: ModelStore) -> None:
        self._store = store
        self._known: set[str] = set()

    def __contains__(self, model_id: object) -> bool:
        if not isinstance(model_id, str):
            return False
        if model_id in self._known:
            return True
        ok = can_run_jobs(model_id, self._store)
        if ok:
            self._known.add(model_id)
        return ok
