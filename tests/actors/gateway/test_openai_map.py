"""The OpenAI -> protocol v1 mapping (pure): every field lands where docs/http.md says,
and what cannot be honoured is a 400 naming the parameter."""

from __future__ import annotations

import pytest

from uniun.actors.gateway import openai_map as om
from uniun.actors.gateway.errors import ApiError, from_protocol
from uniun.protocol.jobmap import validate_job

CHAT = [{"role": "user", "content": "hi"}]


def chat(**body: object) -> om.JobRequest:
    return om.chat_job({"model": "m", "messages": CHAT, **body}, default_max_tokens=512,
                       now=1000.0)


def test_a_chat_maps_onto_a_valid_job_map() -> None:
    req = chat(max_tokens=32, temperature=0.5, top_p=0.9, seed=4, stop="\n\n", stream=True,
               stream_options={"include_usage": True},
               response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
                   "type": "object"}}})
    job = req.job
    assert job["kind"] == "chat" and job["model_id"] == "m" and job["max_new_tokens"] == 32
    assert job["sampling"] == {"defaults": "model", "temperature": 0.5, "top_p": 0.9,
                               "seed": 4}
    assert job["stop"] == ["\n\n"]
    assert job["format"] == {"type": "json_schema", "schema": {"type": "object"}}
    assert req.stream and req.include_usage and req.object_id == f"chatcmpl-{job['job_id']}"
    spec = validate_job(job, default_model="m")  # the scheduler accepts exactly this map
    assert spec.stop == ("\n\n",) and spec.format is not None


def test_defaults_are_the_models_chat_defaults() -> None:
    job = chat().job
    assert job["sampling"] == {"defaults": "model"}  # docs/models.md, "Chat defaults"
    assert job["max_new_tokens"] == 512
    assert chat(max_completion_tokens=7, max_tokens=99).job["max_new_tokens"] == 7
    completion = om.completion_job({"model": "m", "prompt": ["once"]}, default_max_tokens=16,
                                   now=0.0)
    assert completion.job["prompt"] == "once" and completion.job["max_new_tokens"] == 16


def test_messages_roles_and_text_parts() -> None:
    job = chat(messages=[{"role": "developer", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "a"},
                                                      {"type": "text", "text": "b"}]}]).job
    assert job["messages"] == [{"role": "system", "content": "be brief"},
                               {"role": "user", "content": "ab"}]


def test_the_uniun_extension_schedules() -> None:
    job = chat(uniun={"kind": "nataraj", "flow": "cards", "deadline_in_s": 30,
                      "foreground_hint": False, "top_k": 40}).job
    assert job["kind"] == "nataraj" and job["flow"] == "cards"
    assert job["deadline"] == 1030.0 and job["sampling"]["top_k"] == 40
    validate_job(job, default_model="m")
    with pytest.raises(ApiError) as err:
        chat(uniun={"dead_line": 3})
    assert err.value.param == "uniun.dead_line"


@pytest.mark.parametrize("body, param", [
    ({"n": 9}, "n"), ({"n": 0}, "n"), ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"logprobs": "yes"}, "logprobs"), ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logit_bias": {"1": 5}}, "logit_bias"),
    ({"temperature": 2.5}, "temperature"), ({"top_p": 0}, "top_p"), ({"seed": -1}, "seed"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": -3}, "presence_penalty"), ({"min_p": 2}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"top_k": -1}, "top_k"),
    ({"repeat_penalty": 1.1, "repetition_penalty": 1.2}, "repeat_penalty"),
    ({"repeat_last_n": -2}, "repeat_last_n"), ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"verbosity": "high"}, "verbosity"), ({"web_search_options": {}}, "web_search_options"),
    ({"grammar": "root ::= x"}, "grammar"), ({"ignore_eos": True}, "ignore_eos"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"max_tokens": 0}, "max_tokens"), ({"stop": ["a"] * 5}, "stop"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f",
      "arguments": "{"}}]}]}, "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]"),
    ({"model": ""}, "model"), ({"stream": "yes"}, "stream"),
])
def test_what_cannot_be_honoured_is_400(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as err:
        chat(**body)
    assert err.value.status == 400 and err.value.param == param


def test_ignored_fields_are_ignored() -> None:
    job = chat(user="u1", metadata={"a": "b"}, store=False, prediction={"type": "content"},
               service_tier="auto", n=1, parallel_tool_calls=False, verbosity="medium").job
    assert set(job) == {"kind", "job_id", "model_id", "max_new_tokens", "sampling", "messages"}


def test_every_sampling_control_reaches_the_job_map() -> None:
    job = chat(temperature=0, frequency_penalty=0.5, presence_penalty=-0.5, top_k=40,
               min_p=0.05, repeat_penalty=1.1, repeat_last_n=32, seed=9).job
    assert job["sampling"] == {"defaults": "model", "temperature": 0.0, "min_p": 0.05,
                               "frequency_penalty": 0.5, "presence_penalty": -0.5,
                               "repetition_penalty": 1.1, "seed": 9, "repeat_last_n": 32,
                               "top_k": 40}
    validate_job(job, default_model="m")
    assert chat(repetition_penalty=1.2).job["sampling"]["repetition_penalty"] == 1.2


def test_logprobs_tools_and_n_map_to_the_jobs() -> None:
    req = chat(logprobs=True, top_logprobs=5, n=3, seed=10, tools=[{
        "type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        tool_choice="required")
    assert req.logprobs == 5 and req.n == 3 and req.tools
    jobs = req.jobs()
    assert [j["job_id"] for j in jobs] == [f"{req.job['job_id']}-{i}" for i in range(3)]
    assert [j["sampling"]["seed"] for j in jobs] == [10, 11, 12]
    assert all(j["cache_prompt"] and j["flow"] == req.job["job_id"] for j in jobs)
    assert all(j["logprobs"] == 5 and j["tool_choice"] == "required" for j in jobs)
    for job in jobs:
        validate_job(job, default_model="m")
    assert chat(logprobs=True).logprobs == 0 and chat(logprobs=False).logprobs is None
    assert not chat(tools=[{"type": "function", "function": {"name": "f"}}],
                    tool_choice="none").tools
    legacy = om.completion_job({"model": "m", "prompt": "x", "logprobs": 3}, now=0.0,
                               default_max_tokens=16)
    assert legacy.job["logprobs"] == 3


def test_embedding_inputs() -> None:
    assert om.embedding_texts({"model": "e", "input": "x"}, model="e") == ["x"]
    with pytest.raises(ApiError) as err:
        om.embedding_texts({"model": "other", "input": "x"}, model="e")
    assert err.value.status == 404
    with pytest.raises(ApiError):
        om.embedding_texts({"model": "e", "input": [[1, 2, 3]]}, model="e")


@pytest.mark.parametrize("code, status", [
    ("invalid_field", 400), ("unknown_model", 404), ("queue_full", 429),
    ("shutting_down", 503), ("runner_failed", 503), ("internal", 500), ("poisoned", 422)])
def test_protocol_codes_map_to_openai_statuses(code: str, status: int) -> None:
    error = from_protocol(code, "why", "max_new_tokens")
    assert error.status == status
    assert ("Retry-After" in error.headers()) == (status in (429, 503))
    if code == "invalid_field":
        assert error.param == "max_tokens"


def test_a_poisoned_request_is_a_client_error_no_sdk_retries_with_a_fixed_message() -> None:
    error = from_protocol("poisoned", "the scheduler died 2 times validating job http-1 "
                          "(last: exited -11 in /home/u/.uniun)")
    assert (error.status, error.code, error.headers()) == (422, "poisoned", {})
    assert "do not send it again" in error.message and ".uniun" not in error.message


def test_responses_and_chunks_have_openai_shapes() -> None:
    from uniun.actors.gateway import openai_responses as orsp
    from uniun.actors.gateway.choices import Choice

    req = chat(stream=True, stream_options={"include_usage": True})
    done = {"job_id": "j", "text": "hey", "finish_reason": "stop", "preemptions": 1,
            "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    body = orsp.response(req, [Choice(0, "j", chat=True)], [done], 5, [None], chat=True)
    assert body["choices"][0]["message"]["content"] == "hey"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert body["uniun"]["preemptions"] == 1
    entries = Choice(0, "j", chat=True).on_token({"text": "h"})
    chunk = orsp.chunk(req, 5, entries, chat=True)
    assert chunk["object"] == "chat.completion.chunk" and chunk["usage"] is None
    assert chunk["choices"] == [{"index": 0, "delta": {"content": "h"}, "logprobs": None,
                                 "finish_reason": None}]
    assert orsp.usage_chunk(req, 5, [done, done], chat=True)["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}  # n = 2: prompt once


@pytest.mark.parametrize("job_id", [{"a": 1}, ["x"], 5, "", "x" * 129])
def test_a_job_id_that_is_not_a_short_string_is_400(job_id: object) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}],
            "uniun": {"job_id": job_id}}
    with pytest.raises(ApiError) as err:
        om.chat_job(body, default_max_tokens=8, now=0.0)
    assert err.value.status == 400 and err.value.param == "uniun.job_id"


def test_a_refusal_for_load_carries_the_runtimes_retry_hint_in_whole_seconds() -> None:
    from uniun.actors.gateway.errors import from_protocol

    assert from_protocol("queue_full", "busy", retry_after_s=2.2).headers() == {
        "Retry-After": "3"}
    assert from_protocol("queue_full", "busy", retry_after_s=0.05).headers() == {
        "Retry-After": "1"}
    assert from_protocol("queue_full", "busy").headers() == {"Retry-After": "1"}
    assert from_protocol("invalid_field", "no").headers() == {}
