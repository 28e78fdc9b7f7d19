"""The model store every test run shares (converting SmolLM2 takes a while).

``$UNIUN_MODELS`` (tests/conftest.py defaults it to ``~/.uniun/models``, the store
``uniun-runtime start`` uses), read at call time like the runtime reads it.
"""

from __future__ import annotations

from uniun.models.store import ModelStore
from uniun.runtime.paths import models_dir


def shared_store() -> ModelStore:
    return ModelStore(models_dir())
