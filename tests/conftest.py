"""Test-wide setup.

Every test session gets its own ``UNIUN_HOME`` (a temporary folder), so tests never
touch a user's runtime. The model store is the exception: converting SmolLM2 takes a
while, so all test runs share one model cache, ``$UNIUN_MODELS`` (default
``~/.uniun/models``, the same store ``uniun-runtime start`` uses).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.models_cache import shared_store

pytest_plugins = ["tests.embedding_fixtures"]  # the MiniLM wheel, model and pool fixtures

os.environ.setdefault("UNIUN_MODELS", str(Path.home() / ".uniun" / "models"))


@pytest.fixture(scope="session", autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("uniun-home")
    os.environ["UNIUN_HOME"] = str(home)
    return home


# -- models: built or pulled into the shared store once, then reused --------------------
@pytest.fixture(scope="session")
def tiny_model() -> str:
    """Model id ``tiny-1``: the tiny synthetic decoder, built in the store if absent."""
    from uniun.models.convert.recipes import ensure_model

    ensure_model("tiny-1", shared_store())
    return "tiny-1"


@pytest.fixture(scope="session")
def tiny_model_b() -> str:
    """Model id ``tiny-2``: a second tiny model (other weights), for model-swap tests."""
    from uniun.models.convert.recipes import ensure_model

    ensure_model("tiny-2", shared_store())
    return "tiny-2"


@pytest.fixture(scope="session")
def smollm2() -> str:
    """Model id ``smollm2-135m-instruct``, pulled and converted on first use (~1 min)."""
    from uniun.models.convert.recipes import ensure_model

    ensure_model("smollm2-135m-instruct", shared_store())
    return "smollm2-135m-instruct"
