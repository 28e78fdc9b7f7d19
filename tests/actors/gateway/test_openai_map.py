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
    assert job["sampling"] == {"temperature": 0.5, "top_p": 0.9, "seed": 4}
    assert job["stop"] == ["\n\n"]
    assert job["format"] == {"type": "json_schema", "schema": {"type": "object"}}
    assert req.stream and req.include_usage and req.object_id == f"chatcmpl-{job['job_id']}"
    spec = validate_job(job, default_model="m")  # the scheduler accepts exactly this map
    assert spec.stop == ("\n\n",) and spec.format is not None


def test_defaults_follow_openai() -> None:
    job = chat().job
    assert job["sampling"] == {"temperature": 1.0}  # OpenAI samples at 1 unless told
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
    ({"n": 2}, "n"), ({"tools": [{"type": "function"}]}, "tools"),
    ({"logprobs": True}, "logprobs"), ({"logit_bias": {"1": 5}}, "logit_bias"),
    ({"temperature": 2.5}, "temperature"), ({"top_p": 0}, "top_p"), ({"seed": -1}, "seed"),
    ({"max_tokens": 0}, "max_tokens"), ({"stop": ["a"] * 5}, "stop"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]"),
    ({"model": ""}, "model"), ({"stream": "yes"}, "stream"),
])
def test_what_cannot_be_honoured_is_400(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as err:
        chat(**body)
    assert err.value.status == 400 and err.value.param == param


def test_ignored_fields_are_ignored() -> None:
    job = chat(user="u1", metadata={"a": "b"}, presence_penalty=0.5, store=False,
               frequency_penalty=0.1, n=1).job
    assert set(job) == {"kind", "job_id", "model_id", "max_new_tokens", "sampling", "messages"}


def test_embedding_inputs() -> None:
    assert om.embedding_texts({"model": "e", "input": "x"}, model="e") == ["x"]
    with pytest.raises(ApiError) as err:
        om.embedding_texts({"model": "other", "input": "x"}, model="e")
    assert err.value.status == 404
    with pytest.raises(ApiError):
        om.embedding_texts({"model": "e", "input": [[1, 2, 3]]}, model="e")


@pytest.mark.parametrize("code, status", [
    ("invalid_field", 400), ("unknown_model", 404), ("queue_full", 429),
    ("shutting_down", 503), ("runner_failed", 503), ("internal", 500)])
def test_protocol_codes_map_to_openai_statuses(code: str, status: int) -> None:
    error = from_protocol(code, "why", "max_new_tokens")
    assert error.status == status
    assert ("Retry-After" in error.headers()) == (status in (429, 503))
    if code == "invalid_field":
        assert error.param == "max_tokens"


def test_responses_and_chunks_have_openai_shapes() -> None:
    req = chat(stream=True, stream_options={"include_usage": True})
    done = {"job_id": "j", "text": "hey", "finish_reason": "stop", "preemptions": 1,
            "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    body = om.chat_response(req, done, 5)
    assert body["choices"][0]["message"]["content"] == "hey"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert body["uniun"]["preemptions"] == 1
    chunk = om.chat_chunk(req, 5, content="h")
    assert chunk["object"] == "chat.completion.chunk" and chunk["usage"] is None
    assert om.chat_chunk(req, 5, usage={"total_tokens": 5}, final_usage=True)["choices"] == []


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
