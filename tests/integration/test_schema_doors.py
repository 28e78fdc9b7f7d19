"""Hostile JSON Schemas against a real runtime: each costs its own request, no process.

The runtime: supervisor, scheduler, runner (the tiny model), HTTP gateway. The schemas
that killed the scheduler in-process (a ``$ref`` chain of 2,500 as ``response_format``,
3,500 as a tool's ``parameters``) get a 400 naming the field, sent with the ``openai``
SDK as a user's program would, and the scheduler's pid is unchanged. Then the schema
fuzzer (runtime/chaos/schema_fuzz.py) runs a bounded sample through both HTTP routes and
the wire: 4xx or a valid answer, ``/health`` 200 throughout, no process died. The long
run is ``uniun-runtime fuzz --http --schemas N`` (docs/fuzzing.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from uniun.runtime.chaos.http_drafts import Target
from uniun.runtime.chaos.schema_fuzz import run_schema_fuzz

from .harness import BASE_CONFIG, Runtime, serving

pytestmark = pytest.mark.integration

CONFIG = BASE_CONFIG + "\n[http]\nport = 0\n"
CI_SCHEMAS = 60  # x 3 routes; `uniun-runtime fuzz --http --schemas 10000` is the long run
CHAT = [{"role": "user", "content": "Hi"}]


def ref_chain(n: int) -> dict[str, Any]:
    """``n`` $refs, each to the next, in a list (a map of 2,500 keys is over the wire's
    limit; a list is not): 63,924 characters at 2,500."""
    return {"anyOf": [{"$ref": f"#/anyOf/{i + 1}"} for i in range(n)] + [{"type": "string"}]}


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Iterator[Runtime]:
    with serving(tmp_path_factory.mktemp("rt-schemas"), CONFIG,
                 "scheduler,runner,http") as runtime:
        yield runtime


@pytest.fixture(scope="module")
def sdk(rt: Runtime) -> openai.OpenAI:
    return openai.OpenAI(base_url=rt.gateway_url() + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


def test_the_schemas_that_crashed_the_scheduler_get_400_naming_the_field(
        rt: Runtime, sdk: openai.OpenAI) -> None:
    pid = rt.pid("scheduler")
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=2,  # type: ignore[arg-type]
                                    response_format={"type": "json_schema", "json_schema": {
                                        "name": "chain", "schema": ref_chain(2_500)}})
    assert caught.value.status_code == 400
    assert "response_format" in str(caught.value.body) and "deeper than" in str(
        caught.value.body)
    tool = {"type": "function", "function": {"name": "f", "description": "d",
                                             "parameters": ref_chain(3_500)}}
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=2,  # type: ignore[arg-type]
                                    tools=[tool])  # type: ignore[list-item]
    assert "tools" in str(caught.value.body) and "parameters" in str(caught.value.body)
    # The scheduler that refused them is the one that serves the next request.
    answer = sdk.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=2,  # type: ignore[arg-type]
                                         response_format={"type": "json_object"})
    assert answer.choices[0].message.content is not None
    assert rt.pid("scheduler") == pid


def test_fuzzed_hostile_schemas_kill_no_process(rt: Runtime) -> None:
    url = rt.gateway_url()
    port = int(url.rsplit(":", 1)[1])
    target = Target("127.0.0.1", port, "tiny-1", "none")
    report = run_schema_fuzz(target, rt.endpoint, CI_SCHEMAS, seed=7, markers=(str(rt.home),))
    assert report.schemas == CI_SCHEMAS
    assert report.deaths == 0 and report.health_failures == 0, report.text()
    assert report.ok, report.text()
    refused = sum(v for k, v in report.outcomes.items() if k.endswith(" 400"))
    served = sum(v for k, v in report.outcomes.items() if k.endswith(" 200"))
    assert refused and served, report.text()  # both answers occurred: hostile and fine
