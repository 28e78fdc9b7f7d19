"""Tool calls on the wire: the job map's ``tools`` and ``tool_choice``, the messages that
carry calls and results, and reading a call back out of a job's text.

A model writes a tool call as text in one fixed form, the Hermes form (the one the Qwen
2.5, Hermes and SmolLM3 chat templates use)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The runner enforces it by constrained decoding (``models/tools.py``), so the JSON parses
and the arguments validate against the function's schema; this module only reads it
back (:func:`parse_tool_calls`), for the scheduler's ``done`` event and the gateway's
OpenAI response. Validation here is shape only: whether a schema compiles is the
scheduler's check (``JobRules.check_format``), as for ``format``.

Pure: no I/O, no grammar engine.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from uniun.protocol.errors import InvalidField

__all__ = [
    "MAX_TOOLS",
    "TOOL_CHOICES",
    "TOOL_CLOSE",
    "TOOL_OPEN",
    "ToolSpec",
    "call_id",
    "canonical",
    "parse_tool_calls",
    "parse_tool_choice",
    "parse_tools",
]

TOOL_OPEN = "<tool_call>\n"
TOOL_CLOSE = "\n</tool_call>"
TOOL_CHOICES = ("none", "auto", "required")  # or {"name": <function>}
MAX_TOOLS = 64
MAX_TOOL_NAME = 64
NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # OpenAI's function-name rule (plus '.')
MAX_TOOLS_CHARS = 131_072  # the tools' JSON text, all together


def canonical(value: Any, *, sort_keys: bool = True) -> str:
    """JSON text that is equal for equal values (specs stay hashable and comparable).

    ``sort_keys=False`` for tools: a schema's property order is the order the model
    writes the arguments in, which a client chooses (the name before the details)."""
    return json.dumps(value, sort_keys=sort_keys, separators=(",", ":"), allow_nan=False,
                      ensure_ascii=False)


@dataclass(frozen=True)
class ToolSpec:
    """A job's tools (canonical JSON of the list) and how it may use them.

    ``choice``: ``none`` (the model answers in text; the tools are not shown to it),
    ``auto`` (text or one call), ``required`` (one call to any of them) or the name of
    the one function it must call.
    """

    tools_json: str
    choice: str = "auto"
    name: str | None = None  # the function when choice == "function"

    @property
    def tools(self) -> list[dict[str, Any]]:
        return json.loads(self.tools_json)

    @property
    def active(self) -> bool:
        """Whether the model is shown the tools and may or must call one."""
        return self.choice != "none"

    def choice_map(self) -> Any:
        return {"name": self.name} if self.choice == "function" else self.choice

    def to_format(self) -> dict[str, Any]:
        """The runner's constraint for this job (``models/tools.py`` compiles it)."""
        return {"type": "tools", "tools": self.tools, "choice": self.choice_map()}


def parse_tools(value: Any) -> list[dict[str, Any]]:
    """The job map's ``tools``: a list of ``{name, description?, parameters?}``."""
    if not isinstance(value, list) or not value:
        raise InvalidField("tools", "must be a non-empty list of {name, description, "
                                    "parameters} maps")
    if len(value) > MAX_TOOLS:
        raise InvalidField("tools", f"at most {MAX_TOOLS} tools")
    out, names = [], set()
    for i, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise InvalidField(f"tools[{i}]", "must be a map with name, description, parameters")
        unknown = set(tool) - {"name", "description", "parameters"}
        if unknown:
            raise InvalidField(f"tools[{i}].{str(min(map(str, unknown)))[:64]}",
                               "unknown tool key")
        name = tool.get("name")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise InvalidField(f"tools[{i}].name", "must be 1-64 characters a-z A-Z 0-9 _ . -")
        if name in names:
            raise InvalidField(f"tools[{i}].name", f"{name!r} is given twice")
        names.add(name)
        entry: dict[str, Any] = {"name": name}
        description = tool.get("description")
        if description is not None:
            if not isinstance(description, str) or len(description) > 4096:
                raise InvalidField(f"tools[{i}].description", "must be a string of at most "
                                                              "4096 characters")
            entry["description"] = description
        parameters = tool.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, dict):
                raise InvalidField(f"tools[{i}].parameters", "must be a JSON Schema map")
            entry["parameters"] = parameters
        out.append(entry)
    try:
        text = canonical(out, sort_keys=False)
    except (TypeError, ValueError) as err:
        raise InvalidField("tools", f"not JSON: {err}") from None
    if len(text) > MAX_TOOLS_CHARS:
        raise InvalidField("tools", f"longer than {MAX_TOOLS_CHARS} characters as JSON")
    return out


def parse_tool_choice(value: Any, names: set[str]) -> tuple[str, str | None]:
    """``(choice, name)`` from the job map's ``tool_choice`` (default ``auto``)."""
    if value is None:
        return "auto", None
    if isinstance(value, str):
        if value not in TOOL_CHOICES:
            raise InvalidField("tool_choice", "must be none, auto, required or {name}")
        return value, None
    if isinstance(value, dict) and set(value) == {"name"}:
        name = value["name"]
        if not isinstance(name, str) or name not in names:
            raise InvalidField("tool_choice.name", "must name one of the job's tools")
        return "function", name
    raise InvalidField("tool_choice", "must be none, auto, required or {name}")


def call_id(job_id: str, index: int) -> str:
    """A stable id for the ``index``-th call of a job (the same on every read)."""
    return f"call_{hashlib.sha256(job_id.encode()).hexdigest()[:20]}_{index}"


def parse_tool_calls(text: str, job_id: str) -> list[dict[str, Any]] | None:
    """The calls written in ``text`` as ``[{id, name, arguments}]``, or None when the text
    is not a complete call (a text answer, or one cut short by ``max_new_tokens``).

    A call starts the text, exactly: the grammar held it to its schema only then (an
    ``auto`` text answer may not start with ``<tool_call>``, and anything later in a
    text answer is text)."""
    body = text.rstrip()
    open_tag, close_tag = TOOL_OPEN.strip(), TOOL_CLOSE.strip()
    if not body.startswith(open_tag):
        return None
    calls: list[dict[str, Any]] = []
    decoder = json.JSONDecoder()
    while body.startswith(open_tag):
        # Decode the JSON value itself: a string argument may contain "</tool_call>".
        start = len(open_tag)
        while body[start:start + 1].isspace():
            start += 1
        try:
            call, end = decoder.raw_decode(body, start)
        except ValueError:
            return None
        rest = body[end:].lstrip()
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) \
                or not isinstance(call.get("arguments", {}), dict) \
                or not rest.startswith(close_tag):
            return None
        calls.append({"id": call_id(job_id, len(calls)), "name": call["name"],
                      "arguments": call.get("arguments", {})})
        body = rest[len(close_tag):].strip()
    return calls if not body else None
