"""The test suite; its folders mirror the rooms (``tests/actors/scheduler`` tests
``actors/scheduler``)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # the checkout's root: docs/, examples/, the rooms
