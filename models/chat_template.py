"""Rendering chat ``messages`` with the model's own chat template, and tokenising input.

The template is whatever the model folder's ``tokenizer_config.json`` carries (for
SmolLM2, the one from its GGUF metadata); rendering goes through transformers'
``apply_chat_template`` so the text is exactly what transformers renders — we do not
keep a second Jinja environment that could drift.

:func:`encode_chat` also finds the *static prefix*: the leading token positions that do
not depend on the conversation's non-system content (the system prompt and the template's
boilerplate). Those positions are what partial eviction keeps and what the prefix cache
shares. It is found without knowing the template: render the conversation again with the
first non-system message's content replaced by two different probes; the token ids all
three renderings share at the start are, by construction, independent of that content.

Tools (``models/tools.py``): a job's tools and its messages' calls and results go to the
template when it knows tools, else through the documented fallback into plain messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from uniun.models.tools import fallback_messages, hf_messages, hf_tools, tools_in_template

__all__ = ["normalize_messages", "render_chat", "encode_chat", "encode_prompt"]

_ROLES = ("system", "user", "assistant", "tool")
_PROBES = ("\x01A", "\x01B")


_EXTRA_KEYS = ("tool_calls", "tool_call_id", "name")


def normalize_messages(messages: Iterable[Mapping[str, Any] | Sequence[str]]
                       ) -> list[dict[str, Any]]:
    """``[{role, content, ...}]`` from maps, ``(role, content)`` pairs, or
    ``(role, content, extra)`` triples (``JobSpec.messages``: extra is the JSON of the
    message's ``tool_calls`` / ``tool_call_id`` / ``name``)."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        extra: dict[str, Any] = {}
        if isinstance(message, Mapping):
            role, content = message.get("role"), message.get("content")
            extra = {k: message[k] for k in _EXTRA_KEYS if message.get(k) is not None}
        elif isinstance(message, Sequence) and not isinstance(message, str) \
                and len(message) in (2, 3):
            role, content = message[0], message[1]
            if len(message) == 3:
                extra = json.loads(message[2])
        else:
            raise ValueError(f"messages[{i}] must be a {{role, content}} map")
        if role not in _ROLES:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(_ROLES)}, got {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string")
        out.append({"role": str(role), "content": content, **extra})
    if not out:
        raise ValueError("messages must not be empty")
    return out


def render_chat(tokenizer: Any, messages: Iterable[Mapping[str, Any] | Sequence[str]],
                *, add_generation_prompt: bool = True,
                tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None) -> str:
    """The prompt text for ``messages``, rendered by transformers with the model's template
    (with ``tools`` shown unless ``tool_choice`` is ``none``)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template; send a raw `prompt` instead")
    msgs = normalize_messages(messages)
    shown = list(tools) if tools and tool_choice != "none" else None
    if tools_in_template(tokenizer):
        kwargs: dict[str, Any] = {"tools": hf_tools(shown)} if shown else {}
        return tokenizer.apply_chat_template(hf_messages(msgs), tokenize=False,
                                             add_generation_prompt=add_generation_prompt,
                                             **kwargs)
    return tokenizer.apply_chat_template(fallback_messages(msgs, shown, tool_choice),
                                         tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def _ids(tokenizer: Any, text: str) -> list[int]:
    # The template already wrote every special token it wants (BOS included).
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_chat(tokenizer: Any, messages: Iterable[Mapping[str, Any] | Sequence[str]],
                *, tools: Sequence[Mapping[str, Any]] | None = None,
                tool_choice: Any = None) -> tuple[list[int], int]:
    """Token ids of the rendered conversation, and its static prefix length (module doc)."""
    msgs = normalize_messages(messages)
    ids = _ids(tokenizer, render_chat(tokenizer, msgs, tools=tools, tool_choice=tool_choice))
    first = next((i for i, m in enumerate(msgs) if m["role"] != "system"), None)
    if first is None:
        return ids, 0
    static = len(ids)
    for probe in _PROBES:
        variant = [dict(m) for m in msgs[: first + 1]]
        variant[first]["content"] = probe
        other = _ids(tokenizer, render_chat(tokenizer, variant, tools=tools,
                                            tool_choice=tool_choice))
        n = 0
        limit = min(static, len(other))
        while n < limit and ids[n] == other[n]:
            n += 1
        static = n
    # Leave at least two prompt positions to feed (the prefill is a pass of >= 2).
    return ids, max(0, min(static, len(ids) - 2))


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a raw prompt, with whatever special tokens the tokenizer adds itself."""
    if not isinstance(text, str) or not text:
        raise ValueError("prompt must be a non-empty string")
    return list(tokenizer(text)["input_ids"])
