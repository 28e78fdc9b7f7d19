"""Bounds on a client's JSON Schema, checked in Python before any native code sees it.

Why: the grammar engine (llguidance, native code) compiles a schema by recursion, once
per nesting level and once per ``$ref`` it follows. A chain of ~2,000 ``$ref`` aliases,
or ~900 objects each holding a ``$ref`` to the next (64 KB, under every size limit),
overflows a thread's 8 MiB stack and kills the whole process with SIGSEGV: no Python
exception, no error reply. So every schema a client sends (``format.schema``, each
tool's ``parameters``) is walked here first, in pure Python with its own bounded
recursion, and refused with a message that names the place inside the schema when it is:

- deeper than :data:`MAX_DEPTH` levels *counting the levels the ``$ref`` s it follows
  add* (the depth the engine recurses to; a recursive schema, a ``$ref`` back to a
  definition being expanded, counts once, as the engine names it and stops);
- larger than :data:`MAX_NODES` maps and lists in all, or with more than
  :data:`MAX_REFS` ``$ref`` s, or one list (``enum``, ``anyOf``, ...) longer than
  :data:`MAX_ITEMS`;
- holding a string (a ``pattern``, a property name, a ``const``) longer than
  :data:`MAX_STRING_CHARS`.

The bounds are an order of magnitude under the crash: the engine survived 800 nested
``$ref`` objects and 2,000 ``$ref`` aliases; real schemas (OpenAI's strict mode allows 5
levels of nesting and 100 properties; tool schemas of popular agent frameworks) stay far
below. What this walk cannot foresee (an engine bug on some other shape) is caught by
the sandbox the scheduler compiles in (``models/grammar_sandbox.py``): the walk keeps the
common attack cheap and its answer precise, the sandbox keeps the unknown one contained.

Pure: no I/O, no grammar engine, cost linear in the schema's size (~0.2 ms for 2 KB).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_DEPTH", "MAX_NODES", "MAX_REFS", "MAX_ITEMS", "MAX_STRING_CHARS",
           "SchemaTooComplex", "check_schema_bounds"]

MAX_DEPTH = 64  # nesting levels, $ref expansions included
MAX_NODES = 20_000  # maps and lists in the whole schema
MAX_REFS = 2_000  # "$ref" keys in the whole schema
MAX_ITEMS = 4_096  # entries in one list or map
MAX_STRING_CHARS = 4_096  # one string: a pattern, a property name, an enum value


class SchemaTooComplex(ValueError):
    """A schema over one of the bounds; the message names where and which bound."""


def check_schema_bounds(schema: Any) -> None:
    """Raise :class:`SchemaTooComplex` unless ``schema`` is within every bound."""
    _Walk(schema).run()


class _Walk:
    """One depth-first walk over a schema, following local ``$ref`` s.

    ``_below`` memoizes, per expanded ``$ref`` target, how deep it reaches below itself,
    so a definition referenced from many places is walked once (linear cost); a target
    still being expanded (a recursive schema) counts as depth 0 there, as the engine
    compiles a recursive reference as a name, not by expanding it again.
    """

    def __init__(self, root: Any) -> None:
        self.root = root
        self.nodes = 0
        self.refs = 0
        self._below: dict[int, int] = {}
        self._expanding: set[int] = set()

    def run(self) -> None:
        self._expanding.add(id(self.root))  # "$ref": "#" is a recursion, as any other
        self._depth(self.root, "", 0)

    def _depth(self, node: Any, path: str, level: int) -> int:
        """How many levels ``node`` reaches below ``level``; raises past a bound."""
        if isinstance(node, str):
            if len(node) > MAX_STRING_CHARS:
                raise SchemaTooComplex(f"{_where(path)}: a string of {len(node)} characters "
                                       f"(at most {MAX_STRING_CHARS})")
            return 0
        if not isinstance(node, (dict, list)):
            return 0
        if level >= MAX_DEPTH:
            raise SchemaTooComplex(f"{_where(path)}: nested deeper than {MAX_DEPTH} levels "
                                   f"(counting the levels each $ref adds)")
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise SchemaTooComplex(f"{_where(path)}: more than {MAX_NODES} objects and "
                                   f"lists in the schema")
        if len(node) > MAX_ITEMS:
            raise SchemaTooComplex(f"{_where(path)}: {len(node)} entries (at most "
                                   f"{MAX_ITEMS})")
        deepest = 0
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            child_path = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and len(key) > MAX_STRING_CHARS:
                raise SchemaTooComplex(f"{_where(path)}: a property name of {len(key)} "
                                       f"characters (at most {MAX_STRING_CHARS})")
            if key == "$ref" and isinstance(node, dict) and isinstance(child, str):
                deepest = max(deepest, self._follow(child, child_path, level))
            deepest = max(deepest, 1 + self._depth(child, child_path, level + 1))
        return deepest

    def _follow(self, ref: str, path: str, level: int) -> int:
        """The depth a ``$ref`` adds: its target's, expanded at this level."""
        self.refs += 1
        if self.refs > MAX_REFS:
            raise SchemaTooComplex(f"{_where(path)}: more than {MAX_REFS} $refs in the "
                                   f"schema")
        target = _resolve(self.root, ref)
        if target is None:
            return 0  # not a local pointer, or a dangling one: the engine's own error
        key = id(target)
        if key in self._expanding:
            return 0  # recursive: compiled as a reference to the definition
        known = self._below.get(key)
        if known is not None:
            if level + 1 + known > MAX_DEPTH:
                raise SchemaTooComplex(f"{_where(path)}: nested deeper than {MAX_DEPTH} "
                                       f"levels (counting the levels each $ref adds)")
            return 1 + known
        self._expanding.add(key)
        try:
            below = self._depth(target, f"{path}->{ref}", level + 1)
        finally:
            self._expanding.discard(key)
        self._below[key] = below
        return 1 + below


def _resolve(root: Any, ref: str) -> Any:
    """The node a local JSON Pointer ``$ref`` (``#``, ``#/$defs/x``) names, or None."""
    if not ref.startswith("#"):
        return None
    node = root
    pointer = ref[1:]
    if not pointer:
        return node
    if not pointer.startswith("/"):
        return None
    for part in pointer[1:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _where(path: str) -> str:
    shown = path if len(path) <= 120 else "..." + path[-117:]
    return f"at {shown}" if shown else "at the top"
