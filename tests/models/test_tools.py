"""Tool calls in the model (tiny model): whatever the weights say, a call parses and its
arguments validate; a conversation with calls and results renders through the template.

The tiny model's weights are random, so only the grammar stands between it and garbage:
which is exactly what these tests need to show that the grammar is enough.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.models_cache import shared_store
from uniun.models.chat_template import render_chat
from uniun.models.convert.recipes import ensure_model
from uniun.models.session import DecoderSession
from uniun.models.tools import tool_grammar
from uniun.protocol.tools import TOOL_OPEN, parse_tool_calls

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object",
                          "properties": {"city": {"type": "string", "maxLength": 20},
                                         "unit": {"enum": ["celsius", "fahrenheit"]},
                                         "days": {"type": "integer", "minimum": 1,
                                                  "maximum": 7}},
                          "required": ["city", "unit"], "additionalProperties": False}}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {
    "zone": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}/[A-Z][a-z]{1,8}$"}},
    "required": ["zone"], "additionalProperties": False}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def session(tiny_model: str) -> DecoderSession:
    return DecoderSession.load(ensure_model(tiny_model, shared_store()), threads=1)


def _run(session: DecoderSession, choice: object, seed: int, **kwargs: object) -> str:
    gen = session.start(messages=kwargs.pop("messages", MESSAGES), max_new_tokens=200,
                        tools=[WEATHER, TIME], tool_choice=choice,
                        sampling={"temperature": 1.0, "seed": seed}, **kwargs)
    list(session.generate(gen))
    # a call always ends (its arguments are bounded here); a random model's text may not
    assert gen.finish_reason == "stop" or not gen.text.startswith("<tool"), gen.text
    return gen.text


@pytest.mark.parametrize("choice", ["required", {"name": "get_time"}])
def test_a_required_call_parses_and_its_arguments_validate(session: DecoderSession,
                                                           choice: object) -> None:
    names = set()
    for seed in range(6):
        text = _run(session, choice, seed)
        calls = parse_tool_calls(text, "j")
        assert calls is not None and len(calls) == 1, text
        tool = {"get_weather": WEATHER, "get_time": TIME}[calls[0]["name"]]
        jsonschema.validate(calls[0]["arguments"], tool["parameters"])
        names.add(calls[0]["name"])
    if isinstance(choice, dict):
        assert names == {"get_time"}


def test_auto_gives_text_or_a_valid_call(session: DecoderSession) -> None:
    kinds = set()
    for seed in range(12):
        text = _run(session, "auto", seed)
        calls = parse_tool_calls(text, "j")
        if text.startswith(TOOL_OPEN.strip()):
            assert calls is not None, text  # whatever starts as a call is a whole call
            jsonschema.validate(calls[0]["arguments"],
                                {"get_weather": WEATHER, "get_time": TIME}[calls[0]["name"]]
                                ["parameters"])
            kinds.add("call")
        else:
            assert calls is None
            kinds.add("text")
    assert kinds  # which of the two a random model picks is its own business


def test_auto_text_can_be_held_to_a_format_too() -> None:
    grammar = tool_grammar([WEATHER], "auto", {"type": "object", "properties": {
        "answer": {"type": "string"}}, "required": ["answer"]})
    assert grammar.startswith("start: text | call") and '"answer"' in grammar


def test_none_shows_no_tools_and_constrains_nothing(session: DecoderSession) -> None:
    gen = session.start(messages=MESSAGES, max_new_tokens=5, tools=[WEATHER],
                        tool_choice="none")
    assert gen.constraint is None
    assert "get_weather" not in session.tokenizer.decode(gen.progress.prompt_ids)


def test_a_conversation_with_a_call_and_its_result_renders_through_the_fallback(
        session: DecoderSession) -> None:
    history = [
        *MESSAGES,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "name": "get_weather",
             "arguments": {"city": "Paris", "unit": "celsius"}}]},
        {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call_1"}]
    text = render_chat(session.tokenizer, history, tools=[WEATHER], tool_choice="auto")
    assert '"name": "get_weather"' in text.split("<|im_start|>user")[0]  # the system turn
    assert TOOL_OPEN + '{"name": "get_weather", "arguments": {"city": "Paris", ' \
        '"unit": "celsius"}}' in text
    assert "<tool_response>\n{\"temp\": 21}\n</tool_response>" in text
    # the job continues from there: the static prefix (system turn with the tools) is
    # cached, and the answer is a text or a valid call
    calls = parse_tool_calls(_run(session, "auto", 3, messages=history), "j")
    assert calls is None or calls[0]["name"] in ("get_weather", "get_time")


class _ToolTemplate:
    """A stand-in tokenizer whose template knows tools (as Qwen 2.5's does)."""

    chat_template = ("{% for t in tools or [] %}TOOL {{ t.function.name }};{% endfor %}"
                     "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
                     "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }}"
                     "{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}")

    def apply_chat_template(self, messages, tools=None, **kwargs):
        from jinja2 import Environment

        return Environment().from_string(self.chat_template).render(messages=messages,
                                                                    tools=tools)


def test_a_template_that_knows_tools_renders_them_itself() -> None:
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"name": "get_weather", "arguments": {"city": "Oslo"}}]},
               {"role": "tool", "content": "cold"}]
    text = render_chat(_ToolTemplate(), history, tools=[WEATHER])
    assert text == ('TOOL get_weather;[user]hi[assistant]CALL get_weather{"city": "Oslo"}'
                    '[tool]cold')
    assert json.loads(text.split("CALL get_weather")[1].split("[")[0]) == {"city": "Oslo"}


def test_open_objects_are_closed_and_emails_bounded_in_the_grammar() -> None:
    from uniun.models.tools import _closed

    schema = {"type": "object", "properties": {
        "to": {"type": "string", "format": "email"},
        "cc": {"type": "array", "items": {"type": "object", "properties": {"x": {}}}},
        "properties": {"type": "object", "properties": {"a": {"type": "string"}}}}}
    closed = _closed(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["cc"]["items"]["additionalProperties"] is False
    assert closed["properties"]["properties"]["additionalProperties"] is False
    assert set(closed["properties"]) == {"to", "cc", "properties"}  # a key is no schema
    assert closed["properties"]["to"]["pattern"] == "^[^@]{1,64}@[^@]{1,255}$"
    assert _closed({"type": "object", "properties": {}, "additionalProperties": True})[
        "additionalProperties"] is True  # said explicitly: kept
