"""The job map's sampling controls, log-probabilities, tools and cache_prompt
(docs/protocol.md): what is accepted, what is refused naming the field, and that a v1
job map still means what it meant."""

from __future__ import annotations

from typing import Any

import pytest

from uniun.models.constrain import check_format
from uniun.protocol import requests as rq
from uniun.protocol.errors import ErrorCode, ProtocolError
from uniun.protocol.jobmap import Sampling, validate_job
from uniun.protocol.tools import parse_tool_calls

RULES = rq.JobRules(default_model="tiny-1",
                    check_format=lambda fmt, _model_id: check_format(fmt))
JOB: dict[str, Any] = {"job_id": "j1", "kind": "chat",
                       "messages": [{"role": "user", "content": "hi"}]}
WEATHER = {"name": "get_weather", "description": "weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


def _submit(**job: Any) -> rq.Submit:
    req = rq.parse_request({"v": 1, "type": "submit", "id": "r1", "job": {**JOB, **job}}, RULES)
    assert isinstance(req, rq.Submit)
    return req


def _field(**job: Any) -> str | None:
    with pytest.raises(ProtocolError) as info:
        _submit(**job)
    assert info.value.code is ErrorCode.INVALID_FIELD
    return info.value.field


def test_a_v1_job_map_means_what_it_meant() -> None:
    job = _submit(sampling={"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None}).job
    assert job.sampling == Sampling(temperature=0.0, top_p=1.0, top_k=0)
    assert job.logprobs is None and job.tools is None and not job.cache_prompt
    again = validate_job(job.to_map(), default_model="tiny-1")
    assert again == job  # the journal's map gives the same spec back
    assert _submit().job.sampling.to_map() == {}  # nothing given: nothing invented


def test_every_sampling_control_round_trips() -> None:
    sampling = {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 7, "min_p": 0.05,
                "repetition_penalty": 1.1, "repeat_last_n": 64, "frequency_penalty": 0.5,
                "presence_penalty": -0.5, "defaults": "model"}
    job = _submit(sampling=sampling, logprobs=20, cache_prompt=True).job
    assert job.sampling.to_map() == sampling
    assert validate_job(job.to_map(), default_model="tiny-1") == job


@pytest.mark.parametrize("sampling, field", [
    ({"repetition_penalty": 0}, "sampling.repetition_penalty"),
    ({"repetition_penalty": 11}, "sampling.repetition_penalty"),
    ({"repeat_last_n": -2}, "sampling.repeat_last_n"),
    ({"repeat_last_n": 1.5}, "sampling.repeat_last_n"),
    ({"frequency_penalty": 2.5}, "sampling.frequency_penalty"),
    ({"presence_penalty": "1"}, "sampling.presence_penalty"),
    ({"min_p": -0.1}, "sampling.min_p"),
    ({"defaults": "ollama"}, "sampling.defaults"),
    ({"repeat_penalty": 1.1}, "sampling.repeat_penalty"),  # llama.cpp's name is not ours
])
def test_bad_sampling_controls_are_refused_naming_the_key(sampling: dict[str, Any],
                                                          field: str) -> None:
    assert _field(sampling=sampling) == field


def test_logprobs_cache_prompt_and_tool_fields_are_checked() -> None:
    assert _field(logprobs=21) == "logprobs"
    assert _field(logprobs=True) == "logprobs"
    assert _field(cache_prompt="yes") == "cache_prompt"
    assert _field(tool_choice="auto") == "tool_choice"  # a choice without tools
    assert _field(tools=[]) == "tools"
    assert _field(tools=[{"name": "bad name"}]) == "tools[0].name"
    assert _field(tools=[WEATHER, WEATHER]) == "tools[1].name"
    assert _field(tools=[{**WEATHER, "strict": True}]) == "tools[0].strict"
    assert _field(tools=[WEATHER], tool_choice={"name": "nope"}) == "tool_choice.name"
    assert _field(tools=[WEATHER], tool_choice="sometimes") == "tool_choice"
    bad_schema = {"name": "f", "parameters": {"type": "nonsense"}}
    assert _field(tools=[WEATHER, bad_schema]) == "tools[1].parameters"


def test_tool_messages_are_kept_and_given_back() -> None:
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "name": "get_weather", "arguments": {"city": "Oslo"}}]},
                {"role": "tool", "content": "cold", "tool_call_id": "c1"}]
    job = _submit(messages=messages, tools=[WEATHER], tool_choice="required").job
    assert job.to_map()["messages"] == messages
    assert job.to_map()["tool_choice"] == "required"
    assert job.tools is not None and job.tools.active
    assert _field(messages=[{"role": "user", "content": "x", "tool_calls": []}]) == (
        "messages[0].tool_calls")
    assert _field(messages=[{"role": "assistant", "content": "", "tool_calls": [
        {"name": "f", "arguments": "{}"}]}]) == "messages[0].tool_calls[0].arguments"
    assert _field(messages=[{"role": "robot", "content": "x"}]) == "messages[0].role"


def test_a_call_is_read_back_from_the_text_and_anything_else_is_not() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    calls = parse_tool_calls(text, "job-1")
    assert calls is not None and calls[0]["name"] == "get_weather"
    assert calls[0]["arguments"] == {"city": "Oslo"}
    assert calls[0]["id"] == parse_tool_calls(text, "job-1")[0]["id"]  # stable
    assert parse_tool_calls(text, "job-2")[0]["id"] != calls[0]["id"]  # type: ignore[index]
    tricky = '<tool_call>\n{"name": "f", "arguments": {"s": "x}}</tool_call>y"}}\n</tool_call>'
    assert parse_tool_calls(tricky, "j")[0]["arguments"] == {"s": "x}}</tool_call>y"}  # type: ignore
    for not_a_call in ("The weather is fine.", text[:-5], text + " and more", " " + text,
                       '<tool_call>\n{"name": 3}\n</tool_call>'):
        assert parse_tool_calls(not_a_call, "j") is None


def test_the_client_field_round_trips_and_is_checked() -> None:
    job = _submit(client="http 127.0.0.1").job
    assert job.client == "http 127.0.0.1"
    assert validate_job(job.to_map(), default_model="tiny-1") == job  # journal and replay
    assert _submit().job.client == "" and "client" not in _submit().job.to_map()
    assert _field(client=7) == "client"
    assert _field(client="x" * 129) == "client"
