"""The grammar sandbox (models/grammar_sandbox.py) with its real child process and the
real grammar engine: a format that crashes the engine costs the request, not the caller.

The crash is the real one: a ``$ref`` chain of 2,500 aliases overflows the engine's stack
(SIGSEGV). The schema bounds refuse it before the sandbox in the product; here it goes
to the sandbox directly, standing for whatever shape the bounds do not foresee.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.models_cache import shared_store
from uniun.models.constrain import FormatError
from uniun.models.grammar_sandbox import GrammarSandbox

ORDINARY = {"type": "json_schema", "schema": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}


def crashing_format(n: int = 2_500) -> dict[str, Any]:
    defs: dict[str, Any] = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(n)}
    defs[f"a{n}"] = {"type": "string"}
    return {"type": "json_schema", "schema": {"$defs": defs, "$ref": "#/$defs/a0"}}


@pytest.fixture()
def sandbox() -> Iterator[GrammarSandbox]:
    box = GrammarSandbox().start()
    yield box
    box.close()


def test_a_format_that_compiles_passes_and_one_that_does_not_is_refused(
        sandbox: GrammarSandbox) -> None:
    sandbox.check(ORDINARY)
    with pytest.raises(FormatError):
        sandbox.check({"type": "json_schema", "schema": {"type": "integer",
                                                         "minimum": 1e308}})


def test_a_crash_refuses_that_request_and_the_next_one_is_served(
        sandbox: GrammarSandbox) -> None:
    first = sandbox.pid
    with pytest.raises(FormatError, match=r"crashed the grammar compiler.*SIGSEGV"):
        sandbox.check(crashing_format())
    assert sandbox.crashes == 1
    assert os.getpid() and sandbox.pid is None  # the caller lives; the child is gone
    sandbox.check(ORDINARY)  # a new child compiles the next request
    assert sandbox.pid not in (None, first)
    # The same format again is answered from the verdict cache: no second crash.
    with pytest.raises(FormatError, match="crashed"):
        sandbox.check(crashing_format())
    assert sandbox.crashes == 1


def test_a_compile_past_the_time_limit_is_refused_and_the_child_replaced() -> None:
    box = GrammarSandbox(timeout_s=1e-9).start()  # no compile answers within a nanosecond
    try:
        with pytest.raises(FormatError, match="within"):
            box.check(ORDINARY)
        assert box.timeouts == 1 and box.pid is None
        box.timeout_s = 60.0  # not cached: the same format compiles once time allows
        box.check(ORDINARY)
    finally:
        box.close()


def test_a_format_that_hangs_the_runners_matcher_is_refused_for_that_model(
        tiny_model: str) -> None:
    """``multipleOf: 2**31`` passes the engine's grammar check, then building its matcher
    over a tokenizer never ends (memory growing): in the runner that would hang every
    job. Compiled for the job's model, as the runner does, it meets the sandbox's limit."""
    store = shared_store()
    box = GrammarSandbox(timeout_s=5.0, model_folder=store.folder).start(warm_model=tiny_model)
    try:
        box.check(ORDINARY, tiny_model)  # a first mask over the model's tokenizer: fine
        with pytest.raises(FormatError, match=r"within|crashed"):
            box.check({"type": "json_schema", "schema": {"type": "number",
                                                         "multipleOf": 2147483648}}, tiny_model)
        box.check(ORDINARY, tiny_model)  # and the next request is served
    finally:
        box.close()
