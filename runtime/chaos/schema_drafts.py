"""Hostile JSON Schemas for the schema fuzzer: the shapes that hurt grammar compilers.

Each draw is ``(label, schema)``. The families, each scaled from harmless to far past
every bound (``protocol/schema_bounds.py``):

- ``nest``: objects or arrays nested N deep;
- ``ref-chain``: N ``$ref`` aliases, each to the next (the shape that overflowed the
  engine's stack at ~2,000), optionally closed into a cycle;
- ``ref-props``: N objects, each a property holding a ``$ref`` to the next (overflowed
  at ~900);
- ``ref-cycle``: mutually recursive definitions, and ``$ref: "#"``;
- ``wide``: huge ``enum``, ``anyOf``, ``oneOf``, ``properties``, ``required``;
- ``pattern``: regexes with nested quantifiers, huge counts, backreference-like and
  unbalanced syntax, very long literals;
- ``names``: very long and odd property names;
- ``numbers``: bounds, ``multipleOf`` and lengths at the edges of every numeric type;
- ``junk``: wrong types where the schema language expects others.

Pure Hypothesis strategies (the ``test`` extra), no I/O: the runner is
``runtime/chaos/schema_fuzz.py``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

__all__ = ["hostile_schemas"]

SIZES = st.sampled_from([1, 2, 8, 30, 63, 64, 65, 200, 1_000, 2_500])
BIG_COUNTS = st.sampled_from([0, 1, 100, 4_096, 4_097, 20_000])


@st.composite
def _nest(draw: st.DrawFn) -> Any:
    depth = draw(SIZES)
    leaf: Any = {"type": "string"}
    for _ in range(min(depth, 2_500)):
        leaf = ({"type": "object", "properties": {"a": leaf}, "required": ["a"]}
                if draw(st.booleans()) else {"type": "array", "items": leaf})
    return leaf


@st.composite
def _ref_chain(draw: st.DrawFn) -> Any:
    n = draw(SIZES)
    defs: dict[str, Any] = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"$ref": "#/$defs/d0"} if draw(st.booleans()) else {"type": "integer"}
    key = draw(st.sampled_from(["$defs", "definitions"]))
    if key == "definitions":
        defs = {k: {"$ref": v["$ref"].replace("$defs", "definitions")} if "$ref" in v else v
                for k, v in defs.items()}
    return {key: defs, "$ref": f"#/{key}/d0"}


@st.composite
def _ref_props(draw: st.DrawFn) -> Any:
    n = draw(SIZES)
    wrap = draw(st.sampled_from(["properties", "items", "anyOf", "allOf"]))
    defs: dict[str, Any] = {}
    for i in range(n):
        ref = {"$ref": f"#/$defs/d{i + 1}"}
        defs[f"d{i}"] = ({"type": "object", "properties": {"x": ref}} if wrap == "properties"
                         else {"type": "array", "items": ref} if wrap == "items"
                         else {wrap: [ref, {"type": "null"}]})
    defs[f"d{n}"] = {"type": "boolean"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


@st.composite
def _ref_cycle(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["self", "pair", "root", "dangling", "remote", "pointer"]))
    if kind == "self":
        return {"$defs": {"t": {"type": "object", "properties": {
            "kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}}}}, "$ref": "#/$defs/t"}
    if kind == "pair":
        return {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                "$ref": "#/$defs/a"}
    if kind == "root":
        return {"type": "object", "properties": {"next": {"$ref": "#"}}}
    if kind == "dangling":
        return {"$ref": "#/$defs/nowhere"}
    if kind == "remote":
        return {"$ref": draw(st.sampled_from(["http://127.0.0.1:1/x.json", "file:///etc/passwd",
                                              "other.json#/a"]))}
    return {"$defs": {"a~b/c": {"type": "string"}}, "$ref": draw(st.sampled_from(
        ["#/$defs/a~0b~1c", "#/$defs/a~b/c", "#/$defs/~2", "#/$defs/0/1/2", "#%2F"]))}


@st.composite
def _wide(draw: st.DrawFn) -> Any:
    n = draw(BIG_COUNTS)
    shape = draw(st.sampled_from(["enum", "anyOf", "oneOf", "properties", "required"]))
    if shape == "enum":
        return {"enum": [f"v{i}" for i in range(n)] or [None]}
    if shape in ("anyOf", "oneOf"):
        return {shape: [{"const": i} for i in range(n)] or [{"type": "null"}]}
    props = {f"p{i}": {"type": "integer"} for i in range(n)}
    if shape == "properties":
        return {"type": "object", "properties": props}
    return {"type": "object", "properties": props, "required": list(props)}


PATTERNS = ["(a+)+$", "(a|aa)*b", "((a*)*)*", "(.*){1000}", "a{0,65535}", "a{1000}{1000}",
            "[", "(", "\\", "(?<n>a)\\k<n>", "(a)\\1", "[^\\x00-\\x{10FFFF}]", "\\p{Greek}+",
            "(?=a)a", "^$", "x" * 5_000, "(" * 200 + ")" * 200, "[a-z]{1,9999999999}"]


@st.composite
def _pattern(draw: st.DrawFn) -> Any:
    pattern = draw(st.sampled_from(PATTERNS) | st.text(max_size=60))
    where = draw(st.sampled_from(["value", "property"]))
    if where == "property":
        return {"type": "object", "patternProperties": {pattern: {"type": "integer"}}}
    return {"type": "string", "pattern": pattern}


@st.composite
def _names(draw: st.DrawFn) -> Any:
    length = draw(st.sampled_from([0, 1, 300, 4_096, 4_097, 60_000]))
    name = draw(st.sampled_from(["k", "\u202e", "\x00", "\"", "\\", "\ud7ff"])) * length
    return {"type": "object", "properties": {name: {"type": "string"}}, "required": [name]}


EDGES = [0, -1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 2**64, 10**30, 1e308, -1e308, 5e-324,
         0.1, 1e-300]


@st.composite
def _numbers(draw: st.DrawFn) -> Any:
    key = draw(st.sampled_from(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                "multipleOf", "minLength", "maxLength", "minItems",
                                "maxItems", "minProperties"]))
    value = draw(st.sampled_from(EDGES))
    kind = {"minLength": "string", "maxLength": "string", "minItems": "array",
            "maxItems": "array", "minProperties": "object"}.get(key, draw(st.sampled_from(
                ["integer", "number"])))
    schema: dict[str, Any] = {"type": kind, key: value}
    if kind == "array":
        schema["items"] = {"type": "integer"}
    return schema


@st.composite
def _junk(draw: st.DrawFn) -> Any:
    return draw(st.sampled_from([
        {"type": 7}, {"type": ["string", "integer", "object", "array", "null", "boolean"]},
        {"properties": []}, {"items": "x"}, {"$ref": 5}, {"required": "a"}, {"enum": {}},
        {"anyOf": []}, {"allOf": [{"type": "string"}, {"type": "integer"}]},
        {"not": {}}, {"if": {}, "then": {"type": "string"}}, {"$defs": []},
        {"type": "object", "additionalProperties": {"$ref": "#"}},
        {"const": {"a": [1, {"b": None}]}}, {"format": "date-time", "type": "string"}]))


FAMILIES = {"nest": _nest(), "ref-chain": _ref_chain(), "ref-props": _ref_props(),
            "ref-cycle": _ref_cycle(), "wide": _wide(), "pattern": _pattern(),
            "names": _names(), "numbers": _numbers(), "junk": _junk()}


@st.composite
def hostile_schemas(draw: st.DrawFn) -> tuple[str, Any]:
    """``(family, schema)``: one hostile schema of one family."""
    family = draw(st.sampled_from(sorted(FAMILIES)))
    return family, draw(FAMILIES[family])
