"""Knowledge extraction: the prompt, and a tolerant parser for what a small model answers.

Small on-device models rarely emit clean JSON: they wrap it in code fences or prose,
leave trailing commas, use Python literals or single quotes, stop mid-object when
``max_new_tokens`` runs out, or repeat themselves into a broken structure.
:func:`parse_extraction` repairs what it safely can (as a last resort it salvages the
well-formed entity and relation objects out of a broken whole) and otherwise reports
why it failed; the producer stores the raw text either way, so a
failure is a recorded result, never a dropped one. Pure functions, no I/O.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

SYSTEM_PROMPT = ("You extract knowledge from personal notes. Answer with one JSON object "
                 "listing the entities (people, places, organisations, things, ideas) and "
                 "the relations between them, and nothing else.")
# One worked example: small models copy a shape far better than they follow a schema.
# System prompt + example are the same for every note, so the runner's prefix cache
# serves them after the first extraction.
EXAMPLE_NOTE = "Marie Curie worked in Paris with Pierre Curie."
EXAMPLE_ANSWER = (
    '{"entities": [{"name": "Marie Curie", "type": "person"}, '
    '{"name": "Paris", "type": "place"}, {"name": "Pierre Curie", "type": "person"}], '
    '"relations": [{"source": "Marie Curie", "relation": "worked in", "target": "Paris"}, '
    '{"source": "Marie Curie", "relation": "worked with", "target": "Pierre Curie"}]}')
DEFAULT_MAX_NOTE_CHARS = 4000
ENTITY_TYPES = ("person", "place", "organisation", "thing", "idea", "event", "time")
MAX_ENTITIES = 6  # per note; bounds the answer so it ends well inside max_new_tokens
MAX_RELATIONS = 4
MAX_NAME_CHARS = 40
# What extraction jobs ask the runner for (the job's ``format``): constrained decoding
# makes every answer parse and fit this schema. JSON Schema cannot say "unique by name"
# (``uniqueItems`` compares whole items, and grammar engines do not implement it), so
# the bounds stop a repeating model and :func:`parse_extraction` keeps the first entity
# of each name and the first of each relation triple.
_NAME = {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS}
EXTRACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "entities": {"type": "array", "maxItems": MAX_ENTITIES, "items": {
            "type": "object", "properties": {"name": _NAME, "type": {"enum": list(ENTITY_TYPES)}},
            "required": ["name", "type"], "additionalProperties": False}},
        "relations": {"type": "array", "maxItems": MAX_RELATIONS, "items": {
            "type": "object",
            "properties": {"source": _NAME, "relation": {**_NAME, "maxLength": 32},
                           "target": _NAME},
            "required": ["source", "relation", "target"], "additionalProperties": False}},
    },
    "required": ["entities", "relations"], "additionalProperties": False,
}
EXTRACTION_FORMAT: dict[str, Any] = {"type": "json_schema", "schema": EXTRACTION_SCHEMA}

_FENCE_RE = re.compile(r"```(?:json|JSON)?\s*(.*?)(?:```|$)", re.DOTALL)
_TRAILING_COMMA_RE = re.compile(r",\s*([}\]])")
_SMART_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})
_SOURCE_KEYS = ("source", "subject", "head", "from")
_TARGET_KEYS = ("target", "object", "tail", "to")
_RELATION_KEYS = ("relation", "predicate", "type", "label", "rel")


@dataclass(frozen=True)
class Extraction:
    """The outcome of parsing: ``parsed`` or ``error`` is set, never both."""

    parsed: dict[str, Any] | None
    error: str | None
    repairs: tuple[str, ...] = field(default=())


def extraction_messages(note_text: str, *, title: str | None = None,
                        max_note_chars: int = DEFAULT_MAX_NOTE_CHARS) -> list[dict[str, str]]:
    """The chat messages of one extraction job (system, worked example, the note)."""
    text = note_text if len(note_text) <= max_note_chars else note_text[:max_note_chars] + "\n…"
    head = f"Title: {title}\n" if title else ""
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Note:\n{EXAMPLE_NOTE}\nJSON:"},
            {"role": "assistant", "content": EXAMPLE_ANSWER},
            {"role": "user", "content": f"Note:\n{head}{text.strip()}\nJSON:"}]


def _candidate(text: str) -> tuple[str | None, list[str]]:
    """The JSON-looking part of ``text``, closed if the model was cut off."""
    repairs: list[str] = []
    fenced = _FENCE_RE.search(text)
    if fenced and ("{" in fenced.group(1) or "[" in fenced.group(1)):
        text = fenced.group(1)
        repairs.append("code_fence")
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        return None, repairs
    start = min(starts)
    if start > 0 and text[:start].strip():
        repairs.append("leading_text")
    stack: list[str] = []
    quote: str | None = None
    escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not stack or stack[-1] != ch:
                return text[start:i], [*repairs, "unbalanced"]
            stack.pop()
            if not stack:
                if text[i + 1:].strip():
                    repairs.append("trailing_text")
                return text[start:i + 1], repairs
    # Cut off: close the open string, drop a dangling key or comma, close the brackets.
    body = text[start:]
    if quote:
        body += quote
    body = re.sub(r'[,:]\s*$', "", body.rstrip())
    body = re.sub(r',\s*"[^"]*"\s*$', "", body)
    return body + "".join(reversed(stack)), [*repairs, "truncated"]


def _loads(fragment: str, repairs: list[str]) -> Any:
    try:
        return json.loads(fragment)
    except json.JSONDecodeError:
        pass
    cleaned = _TRAILING_COMMA_RE.sub(r"\1", fragment.translate(_SMART_QUOTES))
    try:
        value = json.loads(cleaned)
        repairs.append("trailing_comma_or_quotes")
        return value
    except json.JSONDecodeError:
        pass
    pythonish = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False",
                                                   re.sub(r"\bnull\b", "None", cleaned)))
    try:
        value = ast.literal_eval(pythonish)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as err:
        raise ValueError(f"not JSON: {err.__class__.__name__}: {err}") from None
    repairs.append("python_literal")
    return value


def _name(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def _entity(item: Any) -> dict[str, Any] | None:
    if isinstance(item, dict):
        name = _name(item.get("name", item.get("entity", item.get("text"))))
        kind = _name(item.get("type", item.get("label", item.get("category"))))
        return {"name": name, "type": kind} if name else None
    name = _name(item)
    return {"name": name, "type": None} if name else None


def _relation(item: Any) -> dict[str, str] | None:
    if isinstance(item, (list, tuple)) and len(item) == 3:
        parts = [_name(p) for p in item]
        if all(parts):
            return {"source": parts[0], "relation": parts[1], "target": parts[2]}  # type: ignore[dict-item]
        return None
    if not isinstance(item, dict):
        return None

    def pick(keys: tuple[str, ...]) -> str | None:
        return next((n for n in (_name(item.get(k)) for k in keys) if n), None)

    source, target, relation = pick(_SOURCE_KEYS), pick(_TARGET_KEYS), pick(_RELATION_KEYS)
    if source and target:
        return {"source": source, "relation": relation or "related_to", "target": target}
    return None


_FLAT_OBJECT_RE = re.compile(r"\{[^{}\[\]]*\}")


def _salvage(raw: str) -> tuple[list[Any], list[Any]]:
    """Flat ``{...}`` objects that parse on their own, sorted into entities and relations.

    The last resort for an answer whose overall structure is broken (a small model that
    repeats itself, closes the wrong bracket, or runs out of tokens mid-list), while the
    individual entity and relation objects in it are fine.
    """
    entities: list[Any] = []
    relations: list[Any] = []
    for match in _FLAT_OBJECT_RE.finditer(raw.translate(_SMART_QUOTES)):
        try:
            value = _loads(match.group(0), [])
        except ValueError:
            continue
        if not isinstance(value, dict):
            continue
        keys = {str(k).lower() for k in value}
        if keys & set(_SOURCE_KEYS) and keys & set(_TARGET_KEYS):
            relations.append(value)
        elif keys & {"name", "entity", "text"}:
            entities.append(value)
    return entities, relations


def parse_extraction(raw: str) -> Extraction:
    """Entities and relations from a model's answer, repairing what it safely can."""
    fragment, repairs = _candidate(raw)
    if fragment is None:
        return Extraction(None, "no JSON object in the answer", tuple(repairs))
    try:
        value = _loads(fragment, repairs)
    except ValueError as err:
        salvaged, salvaged_relations = _salvage(raw)
        if not salvaged and not salvaged_relations:
            return Extraction(None, str(err), tuple(repairs))
        value = {"entities": salvaged, "relations": salvaged_relations}
        repairs.append("salvaged_objects")
    if isinstance(value, list):
        value = {"entities": value}
        repairs.append("bare_list")
    if not isinstance(value, dict):
        return Extraction(None, f"expected a JSON object, got {type(value).__name__}",
                          tuple(repairs))
    lowered = {str(k).lower(): v for k, v in value.items()}
    raw_entities = lowered.get("entities", lowered.get("nodes", []))
    raw_relations = lowered.get("relations", lowered.get("relationships", lowered.get("edges", [])))
    if "entities" not in lowered and "relations" not in lowered and not (
            "nodes" in lowered or "edges" in lowered or "relationships" in lowered):
        return Extraction(None, "the object has neither 'entities' nor 'relations'",
                          tuple(repairs))
    if not isinstance(raw_entities, list) or not isinstance(raw_relations, list):
        return Extraction(None, "'entities' and 'relations' must be lists", tuple(repairs))
    entities: list[dict[str, Any]] = []
    known: set[str] = set()
    for entity in filter(None, map(_entity, raw_entities)):
        if entity["name"].lower() not in known:  # small models repeat themselves
            known.add(entity["name"].lower())
            entities.append(entity)
    relations: list[dict[str, str]] = []
    for rel in filter(None, map(_relation, raw_relations)):
        if rel not in relations:
            relations.append(rel)
    dropped = sum(1 for e in raw_entities if not _entity(e)) + \
        sum(1 for r in raw_relations if not _relation(r))
    if dropped:
        repairs.append(f"dropped_{dropped}_items")
    for rel in relations:  # an entity named only in a relation is still an entity
        for end in (rel["source"], rel["target"]):
            if end.lower() not in known:
                known.add(end.lower())
                entities.append({"name": end, "type": None})
    return Extraction({"entities": entities, "relations": relations}, None, tuple(repairs))
