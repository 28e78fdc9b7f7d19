"""Job events -> OpenAI's response objects: the whole ``chat.completion`` /
``text_completion`` of a request's ``n`` jobs, and the chunks of its SSE stream.

The per-choice work (text, tool calls, log-probabilities) is :class:`~uniun.actors.
gateway.choices.Choice`'s; this module wraps choices in the response envelope: the
request's id and model, the usage summed over its jobs, and the ``uniun`` extension
(job ids, tiers, preemptions, timings; one entry per job when ``n`` > 1).

Pure: no I/O, no clock of its own (``created`` is passed in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from uniun.actors.gateway.choices import Choice
from uniun.actors.gateway.openai_map import JobRequest

__all__ = ["chunk", "response", "role_chunk", "uniun_info", "usage_chunk", "usage_of"]


def usage_of(dones: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Usage over the request's jobs: the prompt counted once (the jobs share it)."""
    prompt = max((int((d.get("usage") or {}).get("prompt_tokens", 0)) for d in dones),
                 default=0)
    completion = sum(int((d.get("usage") or {}).get("completion_tokens", 0)) for d in dones)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _one_info(done: Mapping[str, Any], accepted: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"job_id": done.get("job_id"), "tier": (accepted or {}).get("tier"),
            "preemptions": done.get("preemptions", 0), "timings": done.get("timings")}


def uniun_info(dones: Sequence[Mapping[str, Any]],
               accepted: Sequence[Mapping[str, Any] | None]) -> dict[str, Any]:
    """The ``uniun`` extension: the job's, or with ``n`` > 1 a list under ``jobs``."""
    infos = [_one_info(d, a) for d, a in zip(dones, accepted)]
    return infos[0] if len(infos) == 1 else {"jobs": infos}


def _envelope(req: JobRequest, created: int, *, chat: bool, chunked: bool) -> dict[str, Any]:
    kind = ("chat.completion.chunk" if chunked else "chat.completion") if chat \
        else "text_completion"
    return {"id": req.object_id, "object": kind, "created": created, "model": req.model,
            "system_fingerprint": None}


def response(req: JobRequest, choices: Sequence[Choice], dones: Sequence[Mapping[str, Any]],
             created: int, accepted: Sequence[Mapping[str, Any] | None],
             *, chat: bool) -> dict[str, Any]:
    """The non-streamed response of a request whose jobs all ended with ``done``."""
    body = _envelope(req, created, chat=chat, chunked=False)
    body["choices"] = [c.whole(d) for c, d in zip(choices, dones)]
    body["usage"] = usage_of(dones)
    body["uniun"] = uniun_info(dones, accepted)
    return body


def chunk(req: JobRequest, created: int, entries: list[dict[str, Any]], *,
          chat: bool) -> dict[str, Any]:
    """One SSE chunk carrying choice entries (``Choice.on_token`` / ``on_done``)."""
    body = _envelope(req, created, chat=chat, chunked=True)
    body["choices"] = entries
    if req.include_usage:
        body["usage"] = None
    return body


def role_chunk(req: JobRequest, created: int, index: int) -> dict[str, Any]:
    """A chat stream's first chunk for a choice: ``delta: {role, content: ""}``."""
    return chunk(req, created, [{"index": index, "delta": {"role": "assistant", "content": ""},
                                 "logprobs": None, "finish_reason": None}], chat=True)


def usage_chunk(req: JobRequest, created: int, dones: Sequence[Mapping[str, Any]], *,
                chat: bool) -> dict[str, Any]:
    """``stream_options.include_usage``: the last chunk, no choices, the usage."""
    body = _envelope(req, created, chat=chat, chunked=True)
    body["choices"] = []
    body["usage"] = usage_of(dones)
    return body
