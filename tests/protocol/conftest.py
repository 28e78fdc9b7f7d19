"""Fixtures of the protocol room's tests: short ipc endpoints and FakeSchedulers."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.protocol.protocol_fakes import FakeScheduler


@pytest.fixture
def ipc_endpoint() -> Iterator[str]:
    """A short ipc path (Unix socket paths are limited to 107 bytes)."""
    folder = tempfile.mkdtemp(prefix="uz")
    yield f"ipc://{folder}/front.sock"
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def fake_scheduler() -> Iterator[Callable[..., FakeScheduler]]:
    """Factory: ``fake_scheduler(endpoint, **options)`` -> a started FakeScheduler."""
    started: list[FakeScheduler] = []

    def make(endpoint: str, **options: Any) -> FakeScheduler:
        fake = FakeScheduler(endpoint, **options).start()
        started.append(fake)
        return fake

    yield make
    for fake in started:
        fake.stop()
