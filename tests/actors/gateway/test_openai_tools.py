"""The gateway's tool calls and choices, without a runtime: OpenAI's request shapes to the
job map's, a job's call text to ``tool_calls`` whole or in deltas, logprobs per choice."""

from __future__ import annotations

import json
import random

import pytest

from uniun.actors.gateway.choices import Choice
from uniun.actors.gateway.errors import ApiError
from uniun.actors.gateway.openai_tools import (
    CallStream,
    openai_calls,
    parse_tool_message,
    split_call,
    tool_fields,
)
from uniun.protocol.tools import call_id

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}' \
       '\n</tool_call>'
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}, "strict": True}}


def _pieces(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), k=min(12, len(text) - 1)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def _stream(stream: CallStream, pieces: list[str]) -> list[dict]:
    deltas = [d for p in pieces for d in stream.push(p)]
    return deltas + stream.finish()


@pytest.mark.parametrize("seed", range(8))
def test_a_streamed_call_is_its_name_then_its_arguments_exactly(seed: int) -> None:
    deltas = _stream(CallStream("job", calls_possible=True), _pieces(CALL, seed))
    assert not any("content" in d for d in deltas)
    head = deltas[0]["tool_calls"][0]
    assert head["id"] == call_id("job", 0) and head["type"] == "function"
    assert head["function"] == {"name": "get_weather", "arguments": ""}
    arguments = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[1:])
    assert arguments == split_call(CALL)[1] == '{"city": "Zürich", "days": 3}'  # type: ignore
    assert json.loads(arguments) == {"city": "Zürich", "days": 3}


@pytest.mark.parametrize("text", ["The weather is fine.", "<b>bold</b> text", "<tool",
                                  "<tool_call>\nnot json at all"])
def test_text_that_is_not_a_call_comes_out_as_content_whole(text: str) -> None:
    for seed in range(4):
        pieces = _pieces(text, seed) if len(text) > 2 else [text]
        deltas = _stream(CallStream("job", calls_possible=True), pieces)
        assert "".join(d["content"] for d in deltas) == text
    # without tools nothing is ever held
    stream = CallStream("job", calls_possible=False)
    assert stream.push("<tool") == [{"content": "<tool"}]


def test_a_done_call_becomes_openais_tool_calls() -> None:
    done = {"text": CALL, "tool_calls": [{"id": "call_x_0", "name": "get_weather",
                                          "arguments": {"city": "Zürich", "days": 3}}]}
    assert openai_calls(done) == [{"id": "call_x_0", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Zürich", "days": 3}'}}]
    assert openai_calls({"text": "hi"}) is None


def test_openai_request_shapes_map_to_the_job_maps() -> None:
    fields = tool_fields({"tools": [TOOL], "tool_choice": {
        "type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": False})
    assert fields == {"tools": [{"name": "get_weather", "parameters": TOOL["function"][
        "parameters"]}], "tool_choice": {"name": "get_weather"}}
    assert tool_fields({"tools": [TOOL]})["tool_choice"] == "auto"
    assert tool_fields({}) == {} and tool_fields({"tool_choice": "none"}) == {}
    for body, param in [({"functions": [{}]}, "functions"),
                        ({"tools": [{"type": "custom", "custom": {}}]}, "tools[0]"),
                        ({"tool_choice": "required"}, "tool_choice"),
                        ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
                        ({"tools": [TOOL], "parallel_tool_calls": "no"}, "parallel_tool_calls")]:
        with pytest.raises(ApiError) as info:
            tool_fields(body)
        assert info.value.status == 400 and info.value.param == param
    calls = [{"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                           "arguments": '{"city": "Oslo"}'}}]
    assert parse_tool_message({"role": "assistant", "tool_calls": calls}, 1, "") == {
        "role": "assistant", "content": "", "tool_calls": [
            {"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "c1"}]}
    assert parse_tool_message({"role": "tool", "tool_call_id": "c1"}, 2, "cold") == {
        "role": "tool", "content": "cold", "tool_call_id": "c1"}
    bad = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]
    with pytest.raises(ApiError) as info:
        parse_tool_message({"role": "assistant", "tool_calls": bad}, 1, "")
    assert info.value.param == "messages[1].tool_calls[0].function.arguments"


def _lp(token: str, logprob: float) -> dict:
    return {"token": token, "bytes": list(token.encode()), "logprob": logprob,
            "top_logprobs": [{"token": token, "bytes": list(token.encode()),
                              "logprob": logprob}]}


def test_a_choice_sends_every_tokens_logprobs_even_while_text_is_held() -> None:
    choice = Choice(1, "job", chat=True, logprobs=1)
    events = [{"text": "", "logprobs": _lp("\xe2", -0.5)},  # half a character: no text yet
              {"text": "é", "logprobs": _lp("\xa9", -0.1)},
              {"text": " ok", "logprobs": _lp(" ok", -0.2)}]
    entries = [e for ev in events for e in choice.on_token(ev)]
    entries += choice.on_done({"text": "é ok", "finish_reason": "stop"})
    assert [e["index"] for e in entries] == [1, 1, 1]
    sent = [i for e in entries if e["logprobs"] for i in e["logprobs"]["content"]]
    assert [i["logprob"] for i in sent] == [-0.5, -0.1, -0.2]
    assert entries[-1]["finish_reason"] == "stop" and entries[-1]["delta"] == {}
    whole = Choice(0, "job", chat=False, logprobs=1)
    for ev in events:
        whole.on_token(ev)
    legacy = whole.whole({"text": "é ok", "finish_reason": "length"})["logprobs"]
    assert legacy["token_logprobs"] == [-0.5, -0.1, -0.2]
    assert legacy["text_offset"] == [0, 1, 2] and legacy["top_logprobs"][2] == {" ok": -0.2}
