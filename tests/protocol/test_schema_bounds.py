"""The schema bounds (protocol/schema_bounds.py): what the walk refuses before any native
code sees a schema, and that ordinary and recursive schemas pass.

The refused shapes are the ones that crashed the grammar engine in-process (a ``$ref``
alias chain of 2,500, ~1,000 objects each holding a ``$ref`` to the next); the walk must
refuse them with a message that names where, and must not itself recurse past Python's
limit on any input.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from uniun.protocol.errors import ProtocolError
from uniun.protocol.requests import JobRules, parse_request
from uniun.protocol.schema_bounds import (
    MAX_DEPTH,
    MAX_ITEMS,
    MAX_REFS,
    MAX_STRING_CHARS,
    SchemaTooComplex,
    check_schema_bounds,
)
from uniun.runtime.chaos.schema_drafts import hostile_schemas


def ref_chain(n: int) -> dict[str, Any]:
    defs: dict[str, Any] = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(n)}
    defs[f"a{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/a0"}


def ref_props(n: int) -> dict[str, Any]:
    defs: dict[str, Any] = {f"a{i}": {"type": "object", "properties": {
        "x": {"$ref": f"#/$defs/a{i + 1}"}}} for i in range(n)}
    defs[f"a{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/a0"}


ORDINARY = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
    "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                 "zip": {"type": "string",
                                                         "pattern": "^[0-9]{5}$"}}},
    "kind": {"enum": ["a", "b", "c"]}}, "required": ["name"]}
TREE = {"$defs": {"node": {"type": "object", "properties": {
    "value": {"type": "integer"},
    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
    "$ref": "#/$defs/node"}


@pytest.mark.parametrize("schema", [ORDINARY, TREE, ref_chain(20), ref_props(10),
                                    {"type": "object", "properties": {"next": {"$ref": "#"}}},
                                    {"$ref": "#/$defs/missing"}, True, None])
def test_ordinary_and_recursive_schemas_pass(schema: Any) -> None:
    check_schema_bounds(schema)


@pytest.mark.parametrize("schema, says", [
    (ref_chain(2_500), "deeper than"),  # crashed the scheduler with SIGSEGV in-process
    (ref_props(1_000), "deeper than"),
    (ref_chain(MAX_DEPTH), "deeper than"),
    ({"enum": list(range(MAX_ITEMS + 1))}, "entries"),
    ({"type": "string", "pattern": "a" * (MAX_STRING_CHARS + 1)}, "characters"),
    ({"properties": {"k" * (MAX_STRING_CHARS + 1): {}}}, "property name"),
    ({"anyOf": [{"$ref": "#/$defs/x"}] * (MAX_REFS + 1), "$defs": {"x": {}}}, "$refs"),
])
def test_hostile_shapes_are_refused_with_where_and_why(schema: Any, says: str) -> None:
    with pytest.raises(SchemaTooComplex, match=r"^at ") as caught:
        check_schema_bounds(schema)
    assert says in str(caught.value)


def test_a_ref_reused_at_depth_is_measured_from_where_it_is_used() -> None:
    """The memo of a definition's depth must not let a deep use of it through."""
    deep = ref_props(12)  # ~48 levels below a0
    deep["type"] = "object"
    deep["properties"] = {"shallow": {"$ref": "#/$defs/a0"}}
    check_schema_bounds(deep)
    wrapper: Any = {"$ref": "#/$defs/a0"}
    for _ in range(20):
        wrapper = {"type": "object", "properties": {"w": wrapper}}
    deep["properties"]["deep"] = wrapper
    with pytest.raises(SchemaTooComplex, match="deeper than"):
        check_schema_bounds(deep)


def test_the_submit_is_refused_naming_the_field_without_any_compiler() -> None:
    rules = JobRules(default_model="m")  # no check_format: the bounds run anyway
    job = {"job_id": "j", "kind": "chat", "prompt": "x",
           "format": {"type": "json_schema", "schema": ref_chain(2_500)}}
    with pytest.raises(ProtocolError) as caught:
        parse_request({"v": 1, "type": "submit", "id": "r", "job": job}, rules)
    assert caught.value.code.value == "invalid_field"
    assert caught.value.field == "format.schema"
    tool = {"name": "f", "description": "d", "parameters": ref_props(1_000)}
    job = {"job_id": "j", "kind": "chat", "prompt": "x", "tools": [tool]}
    with pytest.raises(ProtocolError) as caught:
        parse_request({"v": 1, "type": "submit", "id": "r", "job": job}, rules)
    assert caught.value.field == "tools[0].parameters"


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile_schemas())
def test_the_walk_answers_every_hostile_schema_with_a_verdict(drawn: tuple[str, Any]) -> None:
    """Any schema: passes or SchemaTooComplex; never RecursionError or another crash."""
    _, schema = drawn
    try:
        check_schema_bounds(schema)
    except SchemaTooComplex as err:
        assert str(err).startswith("at ")
