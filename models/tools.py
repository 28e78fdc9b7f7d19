"""Tool calls in the model: showing it the tools, and constraining what it writes.

Rendering. A chat template that knows tools (its source uses ``tools``, as Qwen 2.5's,
Hermes' and SmolLM3's do) renders them itself: the tools, the assistant's earlier calls
and the tools' results go to ``apply_chat_template`` in transformers' shapes. A template
without tool syntax (SmolLM2's, Gemma 3's) gets the documented fallback
(docs/structured-output.md, "Tools"): the tools and the call format are described in the
system message, an earlier call is written back as the text the model produced, and a
tool's result comes as a user turn ``<tool_response>...</tool_response>`` (the Hermes
convention).

Constraining. Every call is written in the Hermes form of ``protocol/tools.py``; the
grammar (llguidance's Lark, with ``%json`` for the arguments) allows exactly that for
``required`` and a named function, and text or a call for ``auto`` (text that does not
start with ``<tool_call>``; with a ``format`` too, that text is the format's JSON). The
arguments are generated against the function's JSON Schema, so they parse and validate:
the same engine and the same compact JSON style as ``format``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from uniun.protocol.tools import TOOL_CLOSE, TOOL_OPEN

__all__ = [
    "call_text",
    "fallback_messages",
    "hf_messages",
    "hf_tools",
    "tool_grammar",
    "tools_in_template",
]

ANY_ARGUMENTS: dict[str, Any] = {"type": "object"}
EMAIL_BOUNDS = "^[^@]{1,64}@[^@]{1,255}$"
# Compact JSON, the style of models/constrain.py's JSON_OPTIONS, for %json in Lark.
_X_GUIDANCE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _closed(schema: Any) -> Any:
    """``schema`` with every object that lists ``properties`` and says nothing about
    ``additionalProperties`` closed to them (OpenAI's strict mode does the same), and an
    email address held to RFC 5321's lengths (:data:`EMAIL_BOUNDS`). Why closed: a
    function is called with the arguments it declares; a small model left free to add
    keys invents them (and an unbounded one runs to the token limit), and many functions
    refuse an unexpected keyword. What is generated still validates against the schema
    as given."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            out[key] = {name: _closed(sub) for name, sub in schema[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            out[key] = [_closed(sub) for sub in schema[key]]
    for key in _SCHEMA_ONE:
        if isinstance(schema.get(key), dict):
            out[key] = _closed(schema[key])
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    if schema.get("format") == "email" and "pattern" not in schema:
        # RFC 5321's bounds (64 characters before the @, 255 after): any real address
        # fits them, and a small model that never writes the @ is made to within 64.
        out["pattern"] = EMAIL_BOUNDS
    return out


# Where a JSON Schema holds more schemas: maps of them, lists of them, one of them.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def _call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "object",
            "properties": {"name": {"const": tool["name"]},
                           "arguments": _closed(tool.get("parameters") or ANY_ARGUMENTS)},
            "required": ["name", "arguments"], "additionalProperties": False}


def _lark_string(text: str) -> str:
    return json.dumps(text)


def tool_grammar(tools: Sequence[Mapping[str, Any]], choice: Any,
                 text_format: Mapping[str, Any] | None = None) -> str:
    """The Lark grammar of a job's output with ``tools`` under ``choice``.

    ``choice``: ``auto``, ``required`` or ``{"name": ...}`` (``none`` has no grammar).
    ``text_format``: the job's ``format`` schema map, which then shapes a text answer.
    """
    if isinstance(choice, Mapping):
        chosen = [t for t in tools if t["name"] == choice.get("name")]
        if not chosen:
            raise ValueError(f"tool_choice names no tool: {choice!r}")
    else:
        chosen = list(tools)
    schemas = [_call_schema(t) for t in chosen]
    schema: dict[str, Any] = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    schema = {**schema, "x-guidance": _X_GUIDANCE}
    call = (f"call: {_lark_string(TOOL_OPEN)} %json {json.dumps(schema)} "
            f"{_lark_string(TOOL_CLOSE)}")
    if choice != "auto":
        return f"start: call\n{call}\n"
    if text_format is not None:
        text_schema = {**text_format, "x-guidance": _X_GUIDANCE}
        text = f"text: %json {json.dumps(text_schema)}"
    else:
        # Anything that is not a call: a text answer may not start like one.
        text = f"text: TEXT\nTEXT: /(?s:.+)/ & ~/(?s:{re.escape(TOOL_OPEN.strip())}.*)/"
    return f"start: text | call\n{call}\n{text}\n"


def tools_in_template(tokenizer: Any) -> bool:
    """Whether the chat template renders tools itself."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template


def call_text(calls: Sequence[Mapping[str, Any]]) -> str:
    """Earlier calls written back as the model wrote them (the Hermes form)."""
    return "\n".join(TOOL_OPEN + json.dumps({"name": c["name"],
                                             "arguments": c.get("arguments", {})},
                                            ensure_ascii=False) + TOOL_CLOSE for c in calls)


def _tools_prompt(tools: Sequence[Mapping[str, Any]], choice: Any) -> str:
    lines = ["You can call functions. Each one, with its JSON Schema:"]
    lines += [json.dumps(dict(t), ensure_ascii=False) for t in tools]
    lines.append("To call a function, answer with nothing but:")
    lines.append(TOOL_OPEN + '{"name": <function name>, "arguments": <JSON object>}'
                 + TOOL_CLOSE)
    if isinstance(choice, Mapping):
        lines.append(f"Call the function {choice.get('name')} now.")
    elif choice == "required":
        lines.append("Call one of the functions now.")
    else:
        lines.append("If no function helps, answer in plain text.")
    return "\n".join(lines)


def fallback_messages(messages: Sequence[Mapping[str, Any]],
                      tools: Sequence[Mapping[str, Any]] | None,
                      choice: Any) -> list[dict[str, str]]:
    """Plain ``{role, content}`` messages for a template with no tool syntax."""
    out: list[dict[str, str]] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            calls = call_text(message["tool_calls"])
            out.append({"role": "assistant", "content": f"{content}\n{calls}" if content
                        else calls})
        elif role == "tool":
            result = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1]["content"].startswith(
                    "<tool_response>"):
                out[-1]["content"] += "\n" + result  # consecutive results: one turn
            else:
                out.append({"role": "user", "content": result})
        else:
            out.append({"role": role, "content": content})
    if tools and choice != "none":
        prompt = _tools_prompt(tools, choice)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def hf_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tools in the shape transformers' chat templates read."""
    return [{"type": "function", "function": {"name": t["name"],
                                              "description": t.get("description", ""),
                                              "parameters": t.get("parameters") or ANY_ARGUMENTS}}
            for t in tools]


def hf_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages in transformers' shapes (calls under ``function``)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        item: dict[str, Any] = {"role": message["role"], "content": message.get("content") or ""}
        if message.get("tool_calls"):
            item["tool_calls"] = [{"id": c.get("id"), "type": "function",
                                   "function": {"name": c["name"],
                                                "arguments": c.get("arguments", {})}}
                                  for c in message["tool_calls"]]
        for key in ("tool_call_id", "name"):
            if message.get(key) is not None:
                item[key] = message[key]
        out.append(item)
    return out
