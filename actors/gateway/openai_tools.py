"""OpenAI's tools on the gateway: requests to the job map's ``tools``, ``tool_choice`` and
tool messages, and a job's call back to OpenAI's ``tool_calls``, whole or streamed.

Requests. ``tools`` (``[{"type": "function", "function": {name, description?,
parameters?, strict?}}]``), ``tool_choice`` (``none``, ``auto``, ``required``, ``{"type":
"function", "function": {"name"}}``), an assistant message's ``tool_calls`` (arguments
as a JSON string) and ``tool`` messages become the protocol's shapes
(docs/protocol.md). ``parallel_tool_calls`` is accepted either way: an answer makes at
most one call, which both values allow. ``strict`` is accepted: the arguments always
follow the schema. The legacy ``functions`` / ``function_call`` are refused (use
``tools``).

Responses. The job's text is ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n
</tool_call>`` (``protocol/tools.py``); the ``arguments`` string given back is that
text's own arguments JSON, byte for byte, so the streamed pieces and a non-streamed
answer agree. :class:`CallStream` turns the streamed text into OpenAI's deltas: content
while it cannot be a call, then the call's id and name, then its arguments as they come.

Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from uniun.actors.gateway.errors import bad_request
from uniun.protocol.tools import TOOL_CLOSE, TOOL_OPEN, call_id

__all__ = ["CallStream", "openai_calls", "parse_tool_message", "tool_fields"]

_NAME_KEY = '{"name": "'
_ARGS_KEY = '", "arguments": '
_TAIL = "}" + TOOL_CLOSE  # what ends a call's text after its arguments


def tool_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The job map's ``tools`` and ``tool_choice`` from a chat request (empty: none)."""
    if body.get("functions") is not None or body.get("function_call") is not None:
        raise bad_request("functions and function_call are replaced by tools and "
                          "tool_choice", "functions")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    raw = body.get("tools")
    choice = body.get("tool_choice")
    if raw is None or raw == []:
        if choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return {}
    if not isinstance(raw, list):
        raise bad_request("tools must be a list of function tools", "tools")
    tools = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict) or tool.get("type") != "function" \
                or not isinstance(tool.get("function"), dict):
            raise bad_request("only function tools are supported: {type: function, "
                              "function: {name, description, parameters}}", f"tools[{i}]")
        fn = tool["function"]
        entry = {k: fn[k] for k in ("name", "description", "parameters") if fn.get(k) is not None}
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise bad_request("strict must be a boolean", f"tools[{i}].function.strict")
        tools.append(entry)
    return {"tools": tools, "tool_choice": _choice(choice)}


def _choice(choice: Any) -> Any:
    if choice is None or choice in ("none", "auto", "required"):
        return choice or "auto"
    if isinstance(choice, dict) and choice.get("type") == "function" \
            and isinstance(choice.get("function"), dict) \
            and isinstance(choice["function"].get("name"), str):
        return {"name": choice["function"]["name"]}
    raise bad_request("tool_choice must be none, auto, required or {type: function, "
                      "function: {name}}", "tool_choice")


def parse_tool_message(msg: Mapping[str, Any], i: int, content: str) -> dict[str, Any]:
    """A ``tool`` message, or an ``assistant`` message with ``tool_calls``, as the job
    map's message."""
    if msg.get("role") == "tool":
        out: dict[str, Any] = {"role": "tool", "content": content}
        call = msg.get("tool_call_id")
        if call is not None:
            if not isinstance(call, str) or not 0 < len(call) <= 128:
                raise bad_request("tool_call_id must be a string of 1-128 characters",
                                  f"messages[{i}].tool_call_id")
            out["tool_call_id"] = call
        return out
    calls = msg.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        raise bad_request("tool_calls must be a non-empty list", f"messages[{i}].tool_calls")
    out_calls = []
    for j, call in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request("a tool call must be {id, type: function, function: {name, "
                              "arguments}}", where)
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except (TypeError, ValueError):
            arguments = None
        if not isinstance(arguments, dict):
            raise bad_request("function.arguments must be a JSON object as a string",
                              f"{where}.function.arguments")
        entry = {"name": fn["name"], "arguments": arguments}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out_calls.append(entry)
    return {"role": "assistant", "content": content, "tool_calls": out_calls}


def split_call(text: str) -> tuple[str, str] | None:
    """``(name, arguments JSON text)`` of a whole call text, or None."""
    if not text.startswith(TOOL_OPEN + _NAME_KEY) or not text.rstrip().endswith(_TAIL):
        return None
    body = text.rstrip()[len(TOOL_OPEN):-len(TOOL_CLOSE)]
    try:
        call = json.loads(body)
    except ValueError:
        return None
    start = body.find(_ARGS_KEY)
    if not isinstance(call, dict) or start < 0:
        return None
    return str(call.get("name")), body[start + len(_ARGS_KEY):-1]


def openai_calls(done: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The ``tool_calls`` of a ``done`` event in OpenAI's shape, or None."""
    calls = done.get("tool_calls")
    if not calls:
        return None
    split = split_call(str(done.get("text", "")))
    out = []
    for call in calls:
        arguments = split[1] if split is not None and len(calls) == 1 else json.dumps(
            call.get("arguments", {}), ensure_ascii=False)
        out.append({"id": call["id"], "type": "function",
                    "function": {"name": call["name"], "arguments": arguments}})
    return out


class CallStream:
    """One choice's streamed text, as OpenAI deltas (see the module docstring).

    :meth:`push` takes each token event's text and returns the deltas to send now;
    :meth:`finish` the rest, at the job's end. Text that cannot be the start of a call
    goes out as ``content`` at once; a possible start is held until it is decided.
    """

    def __init__(self, job_id: str, *, calls_possible: bool) -> None:
        self._job_id = job_id
        self._possible = calls_possible
        self._text = ""
        self._mode = "undecided" if calls_possible else "content"
        self._sent = 0  # characters of the text (content) or of the arguments sent

    def push(self, piece: str) -> list[dict[str, Any]]:
        self._text += piece
        if self._mode == "undecided":
            if self._text.startswith(TOOL_OPEN + _NAME_KEY):
                self._mode = "name"
            elif not (TOOL_OPEN + _NAME_KEY).startswith(self._text):
                self._mode = "content"
        if self._mode == "content":
            delta, self._sent = self._text[self._sent:], len(self._text)
            return [{"content": delta}] if delta else []
        if self._mode == "name":
            end = self._text.find(_ARGS_KEY, len(TOOL_OPEN + _NAME_KEY))
            if end < 0:
                return []
            name = json.loads('"' + self._text[len(TOOL_OPEN + _NAME_KEY):end] + '"')
            self._mode, self._args_at = "arguments", end + len(_ARGS_KEY)
            head = {"tool_calls": [{"index": 0, "id": call_id(self._job_id, 0),
                                    "type": "function",
                                    "function": {"name": name, "arguments": ""}}]}
            return [head, *self._arguments()]
        if self._mode == "arguments":
            return self._arguments()
        return []

    def _arguments(self, final: bool = False) -> list[dict[str, Any]]:
        args = self._text[self._args_at:]
        if final:
            stripped = args.rstrip()
            upto = len(stripped) - len(_TAIL) if stripped.endswith(_TAIL) else len(args)
        else:  # hold back what may still be the call's closing text, not its arguments
            upto = len(args) - len(_TAIL)
        upto = max(upto, self._sent)
        piece, self._sent = args[self._sent:upto], upto
        return [{"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}] \
            if piece else []

    def finish(self) -> list[dict[str, Any]]:
        """The deltas still held when the job ended. A call cut short by
        ``max_new_tokens`` ends as far as it got (``finish_reason: length``, as OpenAI's);
        text held as a possible call's start was text after all."""
        if self._mode == "arguments":
            return self._arguments(final=True)
        if self._mode in ("undecided", "name"):
            delta = self._text[self._sent:]
            self._mode, self._sent = "content", len(self._text)
            return [{"content": delta}] if delta else []
        return []
