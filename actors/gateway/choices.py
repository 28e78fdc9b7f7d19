"""One answer of a request (OpenAI's ``choices[i]``): its job's events turned into the
choice object of a response, or into the choice entries of streamed chunks.

A request with ``n`` > 1 runs ``n`` jobs (``routes.py``); each has a :class:`Choice`, and
their entries carry the choice's ``index``. What a choice adds to the plain text:

- ``logprobs``: each token event's log-probabilities (docs/protocol.md) in OpenAI's
  chat shape (``{"content": [{token, logprob, bytes, top_logprobs}]}``) or the legacy
  completions shape (``tokens``, ``token_logprobs``, ``top_logprobs`` maps,
  ``text_offset``). Streamed, each token's entry goes with the next chunk sent, so
  tokens whose text is held back (part of a character, a possible stop string) are not
  lost.
- tool calls: :class:`~uniun.actors.gateway.openai_tools.CallStream` turns the call's
  text into ``tool_calls`` deltas; the finish reason is then ``tool_calls``.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from uniun.actors.gateway.openai_tools import CallStream, openai_calls

__all__ = ["Choice"]


class Choice:
    """See the module docstring. ``logprobs``: None (not asked), else how many
    alternatives per token the client asked for."""

    def __init__(self, index: int, job_id: str, *, chat: bool, tools: bool = False,
                 logprobs: int | None = None) -> None:
        self.index = index
        self.job_id = job_id
        self._chat = chat
        self._calls = CallStream(job_id, calls_possible=chat and tools)
        self._logprobs = logprobs
        self._items: list[dict[str, Any]] = []  # every token's, for the whole answer
        self._offsets: list[int] = []  # each item's offset in the text (text_offset)
        self._unsent = 0  # items not yet sent in a chunk

    # -- streamed ---------------------------------------------------------------------
    def on_token(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Chunk entries for one ``token`` event (none while text is held)."""
        lp = event.get("logprobs")
        if self._logprobs is not None and lp is not None:
            last = self._offsets[-1] + len(self._items[-1]["token"]) if self._items else 0
            self._offsets.append(last)
            self._items.append(dict(lp))
        text = str(event.get("text") or "")
        if not self._chat:
            return [self._entry(text=text)] if text else []
        return [self._entry(delta=d) for d in self._calls.push(text)]

    def on_done(self, done: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The last entries: what was held, then the finish (``delta: {}``)."""
        entries = [self._entry(delta=d) for d in self._calls.finish()] if self._chat else []
        finish = self._entry(delta={}) if self._chat else self._entry(text="")
        finish["finish_reason"] = self.finish_reason(done)
        return [*entries, finish]

    def _entry(self, *, delta: dict[str, Any] | None = None, text: str | None = None
               ) -> dict[str, Any]:
        start, self._unsent = self._unsent, len(self._items)
        entry: dict[str, Any] = {"index": self.index}
        if self._chat:
            entry["delta"] = delta or {}
        else:
            entry["text"] = text or ""
        entry["logprobs"] = self._shape(start) if self._logprobs is not None else None
        entry["finish_reason"] = None
        return entry

    # -- whole ------------------------------------------------------------------------
    def finish_reason(self, done: Mapping[str, Any]) -> str:
        return "tool_calls" if done.get("tool_calls") else str(done.get("finish_reason",
                                                                       "stop"))

    def whole(self, done: Mapping[str, Any]) -> dict[str, Any]:
        """The choice object of a non-streamed response."""
        logprobs = self._shape(0) if self._logprobs is not None else None
        out: dict[str, Any] = {"index": self.index}
        if self._chat:
            calls = openai_calls(done)
            message: dict[str, Any] = {"role": "assistant",
                                       "content": None if calls else done["text"],
                                       "refusal": None}
            if calls:
                message["tool_calls"] = calls
            out["message"] = message
        else:
            out["text"] = done["text"]
        out["logprobs"] = logprobs
        out["finish_reason"] = self.finish_reason(done)
        return out

    def _shape(self, start: int) -> dict[str, Any]:
        """The logprobs of the items from ``start`` on, in the endpoint's shape."""
        items = self._items[start:]
        if self._chat:
            return {"content": [_chat_item(i) for i in items], "refusal": None}
        return {"tokens": [i["token"] for i in items],
                "token_logprobs": [i["logprob"] for i in items],
                "top_logprobs": [{t["token"]: t["logprob"] for t in i["top_logprobs"]}
                                 for i in items],
                "text_offset": self._offsets[start:]}


def _chat_item(item: Mapping[str, Any]) -> dict[str, Any]:
    return {"token": item["token"], "logprob": item["logprob"], "bytes": item["bytes"],
            "top_logprobs": [{"token": t["token"], "logprob": t["logprob"],
                              "bytes": t["bytes"]} for t in item["top_logprobs"]]}
