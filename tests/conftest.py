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

os.environ.setdefault("UNIUN_MODELS", str(Path.home() / ".uniun" / "models"))


@pytest.fixture(scope="session", autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("uniun-home")
    os.environ["UNIUN_HOME"] = str(home)
    return home
