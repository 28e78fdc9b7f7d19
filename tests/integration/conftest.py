"""Fixtures for the end-to-end tests: real runtimes over private homes.

``runtime`` is one runtime shared by every test of the session (starting one costs
seconds of Python imports per process); a test that breaks it on purpose (kills, stops)
or needs another configuration makes its own with ``make_runtime``. On a failure the runtime's log tails are printed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .harness import BASE_CONFIG, Runtime, long_job


@pytest.fixture(scope="session")
def runtime(tmp_path_factory: pytest.TempPathFactory, tiny_model: str,
            tiny_model_b: str) -> Iterator[Runtime]:
    rt = Runtime(tmp_path_factory.mktemp("rt")).start()
    try:
        yield rt
    finally:
        code = rt.stop()
        print(rt.logs())
        assert code == 0, f"the runtime did not stop cleanly (exit {code})"


@pytest.fixture
def make_runtime(tmp_path: Path, tiny_model: str) -> Iterator[Callable[..., Runtime]]:
    made: list[Runtime] = []

    def make(config: str = BASE_CONFIG, env: dict[str, str] | None = None) -> Runtime:
        rt = Runtime(tmp_path / f"rt{len(made)}", config)
        rt.env.update(env or {})  # test hooks (runtime/runner_main.py)
        made.append(rt)
        return rt.start()

    yield make
    for rt in made:
        rt.stop()
        print(rt.logs())


@pytest.fixture(scope="session")
def reference(runtime: Runtime) -> str:
    """The greedy text of ``long_job`` run alone and uninterrupted (any kind: it depends
    only on the model and the prompt)."""
    w = runtime.wire()
    assert w.submit(long_job("reference", "nataraj"))["type"] == "accepted"
    done = w.end("reference")
    assert done["type"] == "done" and done["preemptions"] == 0
    return done["text"]
