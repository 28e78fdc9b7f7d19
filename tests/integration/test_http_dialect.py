"""The OpenAI dialect over HTTP, driven by real clients: the ``openai`` SDK (penalties,
logprobs, n, tools, streaming) and LangChain's ``ChatOpenAI(...).bind_tools(...)``, against
a real runtime with the tiny model.

What a user moving an app over must see: the penalties change the text, log-probabilities
come in OpenAI's shapes (streamed too) with the picked token first when greedy, ``n``
answers in one response, and a tool call whose arguments validate, which a second request
continues with the tool's result.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import openai
import pytest

from tests.wait import WAIT_S, wait_for

from .harness import BASE_CONFIG, Runtime, serving

pytestmark = pytest.mark.integration

CONFIG = BASE_CONFIG + "\n[http]\nport = 0\n"
CHAT = [{"role": "user", "content": "Tell me about the sea and the sky and the sea."}]
WEATHER_PARAMS = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER_PARAMS}}


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Iterator[Runtime]:
    with serving(tmp_path_factory.mktemp("rt-http-dialect"),
                 CONFIG, "scheduler,runner,http") as runtime:
        yield runtime


@pytest.fixture(scope="module")
def base_url(rt: Runtime) -> str:
    url = rt.gateway_url()
    import httpx

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    assert wait_for("the gateway to be ready", healthy)
    return url


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0,
                         timeout=WAIT_S)


def _text(client: openai.OpenAI, **kwargs: object) -> str:
    out = client.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=40,
                                         **kwargs)
    return str(out.choices[0].message.content)


def test_penalties_and_sampling_extensions_change_the_answer(client: openai.OpenAI) -> None:
    plain = _text(client, temperature=0, extra_body={"repeat_penalty": 1.0})
    assert _text(client, temperature=0, extra_body={"repeat_penalty": 1.0}) == plain
    assert _text(client, temperature=0, frequency_penalty=2.0,
                 extra_body={"repeat_penalty": 1.0}) != plain
    assert _text(client, temperature=0, presence_penalty=2.0,
                 extra_body={"repeat_penalty": 1.0}) != plain
    assert _text(client, temperature=0, extra_body={"repeat_penalty": 1.5}) != plain
    # with no sampling field at all: the model's chat defaults (tiny: greedy, penalty 1.1)
    assert _text(client) == _text(client, temperature=0, extra_body={
        "repetition_penalty": 1.1, "repeat_last_n": 64})
    sampled = {"temperature": 1.0, "seed": 3, "extra_body": {"top_k": 5, "min_p": 0.1}}
    assert _text(client, **sampled) == _text(client, **sampled)


def test_logprobs_in_openais_shapes_whole_and_streamed(client: openai.OpenAI) -> None:
    kwargs = {"model": "tiny-1", "messages": CHAT, "max_tokens": 24, "temperature": 0,
                  "logprobs": True, "top_logprobs": 3}
    whole = client.chat.completions.create(**kwargs)
    items = whole.choices[0].logprobs.content
    assert len(items) >= whole.usage.completion_tokens - 1  # every token but an ending EOS
    text = b"".join(bytes(i.bytes) for i in items).decode("utf-8", errors="replace")
    assert text == whole.choices[0].message.content  # token by token, the answer's bytes
    for item in items:
        assert len(item.top_logprobs) == 3 and item.logprob <= 0
        assert item.top_logprobs[0].token == item.token  # greedy: the first is the pick
        assert item.top_logprobs[0].logprob == item.logprob
    streamed = [i for c in client.chat.completions.create(stream=True, **kwargs)
                if c.choices and c.choices[0].logprobs
                for i in c.choices[0].logprobs.content]
    assert [(i.token, i.logprob) for i in streamed] == [(i.token, i.logprob) for i in items]
    legacy = client.completions.create(model="tiny-1", prompt="hello world", max_tokens=8,
                                       temperature=0, logprobs=2)
    lp = legacy.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    assert all(max(top, key=top.get) == tok for tok, top in zip(lp.tokens, lp.top_logprobs))


def test_n_answers_in_one_response_each_with_its_own_seed(client: openai.OpenAI) -> None:
    kwargs = {"model": "tiny-1", "messages": CHAT, "max_tokens": 16, "temperature": 1.0,
              "seed": 7, "n": 3}
    whole = client.chat.completions.create(**kwargs)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    texts = [c.message.content for c in whole.choices]
    assert len(set(texts)) == 3
    assert 16 < whole.usage.completion_tokens <= 3 * 16  # three answers' tokens
    streamed: dict[int, str] = {}
    finishes = {}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content
                                                                       or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert [streamed[i] for i in range(3)] == texts and set(finishes) == {0, 1, 2}
    first = client.chat.completions.create(**{**kwargs, "n": 1})
    assert first.choices[0].message.content == texts[0]  # choice 0 has the seed itself
    assert whole.usage.prompt_tokens == first.usage.prompt_tokens  # the prompt once


def test_a_required_tool_call_validates_and_the_conversation_continues(
        client: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    out = client.chat.completions.create(model="tiny-1", messages=ask, tools=[WEATHER],
                                         tool_choice="required", max_tokens=120,
                                         temperature=1.0, seed=2)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)
    streamed = list(client.chat.completions.create(
        model="tiny-1", messages=ask, tools=[WEATHER], tool_choice="required",
        max_tokens=120, temperature=1.0, seed=2, stream=True))
    deltas = [t for c in streamed if c.choices for t in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "tool_calls"
    history = [*ask, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 18}'}]
    answer = client.chat.completions.create(model="tiny-1", messages=history,
                                            tools=[WEATHER], tool_choice="none",
                                            max_tokens=20, temperature=0)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    named = client.chat.completions.create(
        model="tiny-1", messages=ask, tools=[WEATHER, {"type": "function", "function": {
            "name": "get_time", "parameters": {"type": "object", "properties": {}}}}],
        tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=60)
    assert named.choices[0].message.tool_calls[0].function.name == "get_time"


def test_langchain_bind_tools_round_trips_a_call(base_url: str) -> None:
    from typing import Literal

    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class WeatherArgs(BaseModel):
        # bounded: the tiny model's random weights would not end an unbounded string
        city: str = Field(max_length=16, description="The city")
        unit: Literal["celsius", "fahrenheit"]

    @tool(args_schema=WeatherArgs)
    def get_weather(city: str, unit: str) -> str:
        """The weather in a city, in celsius or fahrenheit."""
        return f"18 degrees {unit} in {city}"

    llm = ChatOpenAI(model="tiny-1", base_url=f"{base_url}/v1", api_key="unused",
                     max_tokens=120, temperature=1.0, seed=4, max_retries=0, timeout=WAIT_S)
    asked = [HumanMessage("What is the weather in Oslo?")]
    reply = llm.bind_tools([get_weather], tool_choice="required").invoke(asked)
    assert len(reply.tool_calls) == 1, (reply.content, reply.response_metadata,
                                        reply.invalid_tool_calls)
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], get_weather.args_schema.model_json_schema())
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    final = llm.bind_tools([get_weather], tool_choice="none").invoke([*asked, reply, result])
    assert isinstance(final.content, str) and final.content and not final.tool_calls
