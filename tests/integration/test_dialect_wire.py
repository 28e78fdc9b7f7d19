"""Sampling controls, log-probabilities and tools through the real runtime (tiny model).

What a user must see: a job with penalties and a seed gives the same text whether it ran
uninterrupted, was preempted and spilled to disk, or had its runner SIGKILLed mid-way
(the penalties' token history and the sampler's seed are part of the job's parked
state); the token events carry the log-probabilities asked for; a job with tools ends
with ``finish_reason: tool_calls`` and calls whose arguments validate.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import jsonschema
import pytest

from .harness import (
    BASE_CONFIG,
    Runtime,
    assert_gap_free,
    chat_job,
    long_job,
    tokens_of,
    wait_for,
    wait_tokens,
)

pytestmark = pytest.mark.integration

# Every paused job is spilled to disk at once, so a spill exists to survive a kill.
CONFIG = BASE_CONFIG + "\n[runner]\nsnapshot_cap_bytes = 0\n"
SAMPLING = {"temperature": 0.9, "top_k": 50, "min_p": 0.01, "seed": 77,
            "repetition_penalty": 1.2, "repeat_last_n": 32, "frequency_penalty": 0.2,
            "presence_penalty": 0.1}
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 24},
               "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Iterator[Runtime]:
    runtime = Runtime(tmp_path_factory.mktemp("rt-dialect"), CONFIG).start()
    try:
        yield runtime
    finally:
        runtime.stop()
        print(runtime.logs())


@pytest.fixture(scope="module")
def penalized_reference(rt: Runtime) -> str:
    w = rt.wire()
    w.submit(long_job("pen-ref", "extract", sampling=SAMPLING))
    done = w.end("pen-ref")
    assert done["type"] == "done" and done["preemptions"] == 0
    assert done["usage"]["completion_tokens"] > 300, "too short to be interrupted mid-way"
    return str(done["text"])


def test_penalties_change_the_text(rt: Runtime, penalized_reference: str) -> None:
    w = rt.wire()
    plain = {k: v for k, v in SAMPLING.items() if "penalty" not in k}
    w.submit(long_job("pen-plain", "extract", sampling=plain, max_new_tokens=300))
    assert not penalized_reference.startswith(w.end("pen-plain")["text"])


def test_a_runner_sigkill_mid_job_changes_nothing_in_the_text(
        rt: Runtime, penalized_reference: str) -> None:
    w = rt.wire()
    w.submit(long_job("pen-kill", "extract", sampling=SAMPLING))
    wait_tokens(w, "pen-kill", 150)
    rt.kill("runner", signal.SIGKILL)
    done = w.end("pen-kill")
    assert done["type"] == "done", done
    events = w.events("pen-kill")
    assert_gap_free(events)
    assert [s["resumed"] for s in events if s["type"] == "started"] == [False, True]
    assert done["text"] == penalized_reference


def test_a_preempted_spilled_job_whose_runner_dies_gives_the_same_text(
        rt: Runtime, penalized_reference: str) -> None:
    rt.wait_serving()
    w = rt.wire()
    w.submit(long_job("pen-spill", "nataraj", sampling=SAMPLING))
    wait_tokens(w, "pen-spill", 100)
    w.submit(chat_job("pen-chat", max_new_tokens=2500))  # parks (spills) the job
    wait_tokens(w, "pen-chat", 20)
    assert w.log[w.index("pen-spill", "paused")]["reason"] == "preempted"
    assert wait_for("the parked job's spill file",
                    lambda: list((rt.home / "run" / "spill").glob("*.kvsnap")))
    rt.kill("runner", signal.SIGKILL)
    assert w.end("pen-chat")["type"] == "error"
    done = w.end("pen-spill")
    assert done["type"] == "done" and done["text"] == penalized_reference
    assert_gap_free(w.events("pen-spill"))
    runner_log = (rt.home / "logs" / "runner.log").read_text()
    assert "continuing from the spilled snapshot" in runner_log  # not a recompute


def test_token_events_carry_logprobs_whose_first_alternative_is_the_greedy_pick(
        rt: Runtime) -> None:
    rt.wait_serving()
    w = rt.wire()
    w.submit(chat_job("lp", logprobs=3, max_new_tokens=40,
                      sampling={"repetition_penalty": 1.3}))
    done = w.end("lp")
    assert done["type"] == "done"
    tokens = tokens_of(w.events("lp"))
    with_lp = [t for t in tokens if "logprobs" in t]
    assert len(with_lp) >= len(tokens) - 1  # all but an ending EOS
    for t in with_lp:
        lp = t["logprobs"]
        assert lp["top_logprobs"][0]["token"] == lp["token"]
        assert lp["top_logprobs"][0]["logprob"] == lp["logprob"] <= 0.0
        assert len(lp["top_logprobs"]) == 3
        assert bytes(lp["bytes"]).decode("utf-8", "replace") == lp["token"]


def test_a_required_tool_call_ends_the_job_with_valid_arguments(rt: Runtime) -> None:
    rt.wait_serving()
    w = rt.wire()
    w.submit(chat_job("tool", tools=[WEATHER], tool_choice="required", max_new_tokens=120,
                      sampling={"temperature": 1.0, "seed": 5}))
    done = w.end("tool")
    assert done["type"] == "done" and done["finish_reason"] == "tool_calls", done
    (call,) = done["tool_calls"]
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    jsonschema.validate(call["arguments"], WEATHER["parameters"])
    refused = w.submit(chat_job("tool-bad", tools=[{"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "nope"}}}}]))
    assert refused["type"] == "error" and refused["field"] == "tools[0].parameters"
