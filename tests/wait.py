"""The one way tests wait: poll a condition until it holds, with a generous deadline.

Nothing in the suite asserts on timing (a loaded small machine is slow); a wait that
runs out fails with what it was waiting for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

WAIT_S = 120.0  # generous upper bound for anything to happen


def wait_for(what: str, check: Callable[[], T], timeout: float = WAIT_S,
             every: float = 0.05) -> T:
    """``check()``'s first truthy value; ``AssertionError`` naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)
