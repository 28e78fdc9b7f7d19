"""The HTTP gateway driven by the official ``openai`` SDK, against a real runtime.

A client no one here wrote: the SDK's own request building, SSE parsing, base64
embedding decoding and error classes. The runtime is the product's (supervisor,
scheduler, runner, embedding pool, gateway; the tiny model), its gateway on a free port.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import numpy as np
import openai
import pytest

from tests.wait import WAIT_S, wait_for

from .harness import BASE_CONFIG, Runtime, long_job, serving

pytestmark = pytest.mark.integration

QUEUE_CAP = 3
CONFIG = BASE_CONFIG.replace("[embed]\nenabled = false", "[embed]\nenabled = true\nworkers = 1") \
    + f"\n[http]\nport = 0\n\n[limits]\nqueue_cap = {QUEUE_CAP}\n" \
    + "chat_reserve_share = 0.0\nclient_share = 1.0\n"  # one wire's jobs fill the queue
CHAT = [{"role": "user", "content": "Hello! How are you?"}]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, tiny_model: str, minilm_dir: Path
       ) -> Iterator[Runtime]:
    with serving(tmp_path_factory.mktemp("rt-http"),
                 CONFIG, "scheduler,runner,embed,http") as runtime:
        yield runtime


@pytest.fixture(scope="module")
def base_url(rt: Runtime) -> str:
    return rt.gateway_url()


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    ok = wait_for("the gateway to be ready", lambda: _health(base_url) == 200)
    assert ok
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0,
                         timeout=WAIT_S)


def _health(base_url: str) -> int:
    import httpx

    try:
        return httpx.get(f"{base_url}/health", timeout=5).status_code
    except httpx.HTTPError:
        return 0


def test_endpoint_file_and_models(rt: Runtime, client, base_url: str) -> None:
    assert base_url.startswith("http://127.0.0.1:")
    ids = {m.id for m in client.models.list()}
    assert {"tiny-1", "all-minilm-l6-v2"} <= ids
    assert client.models.retrieve("tiny-1").id == "tiny-1"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_chat_non_streaming_and_streaming_agree(client) -> None:
    full = client.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=20,
                                          temperature=0)
    choice = full.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length" and full.usage.completion_tokens == 20
    assert full.usage.total_tokens == full.usage.prompt_tokens + 20
    chunks = list(client.chat.completions.create(
        model="tiny-1", messages=CHAT, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20


def test_stop_and_seed(client) -> None:
    base = client.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=30,
                                          temperature=0.9, seed=5)
    again = client.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=30,
                                           temperature=0.9, seed=5)
    text = base.choices[0].message.content
    assert again.choices[0].message.content == text  # same seed, same text
    stop = text[8:11]
    cut = client.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=30,
                                         temperature=0.9, seed=5, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop)]


def test_text_completion(client) -> None:
    out = client.completions.create(model="tiny-1", prompt="hello world", max_tokens=8,
                                    temperature=0)
    assert out.object == "text_completion" and out.usage.completion_tokens == 8
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny-1", prompt="hello world", max_tokens=8, temperature=0, stream=True))
    assert streamed == out.choices[0].text


def test_json_schema_output_validates(client) -> None:
    out = client.chat.completions.create(
        model="tiny-1", messages=CHAT, max_tokens=200, temperature=0.7, seed=3,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}})
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
    obj = client.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=300,
                                         temperature=0, response_format={"type": "json_object"})
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)


def test_bad_requests_are_400_and_change_nothing(rt: Runtime, client) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny-1", messages=CHAT, n=9)
    assert err.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny-1", messages=CHAT, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "array", "uniqueItems": True}}})
    assert "uniqueItems" in err.value.message
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="no-such-model", messages=CHAT)
    assert err.value.code == "model_not_found"
    status = rt.status()
    assert status is not None and status["jobs"] == 0


def test_embeddings_through_the_pool(client) -> None:
    out = client.embeddings.create(model="all-minilm-l6-v2", input=["hello", "a note"])
    vectors = np.array([d.embedding for d in out.data], dtype=np.float32)
    assert vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert out.usage.prompt_tokens > 0
    floats = client.embeddings.create(model="all-minilm-l6-v2", input="hello",
                                      encoding_format="float")
    assert np.allclose(floats.data[0].embedding, vectors[0], atol=1e-6)


def test_full_queue_is_429_with_retry_after(rt: Runtime, client) -> None:
    w = rt.wire()
    ids = [f"fill-{i}" for i in range(QUEUE_CAP)]
    for job_id in ids:
        assert w.submit(long_job(job_id, "nataraj"))["type"] == "accepted"
    try:
        with pytest.raises(openai.RateLimitError) as err:
            client.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=4)
        assert err.value.code == "queue_full"
        assert err.value.response.headers["retry-after"] == "1"
    finally:
        for job_id in ids:
            w.request("cancel", job_id=job_id)


def test_cancelled_stream_cancels_its_job(rt: Runtime, client) -> None:
    stream = client.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=2500,
                                            temperature=0, stream=True)
    job_id = None
    for i, chunk in enumerate(stream):
        job_id = chunk.id.removeprefix("chatcmpl-")
        if i >= 3:
            break
    stream.close()  # the HTTP connection goes away mid-stream
    w = rt.wire()
    reply = w.request("attach", job_id=job_id, after_seq=10**6)
    assert reply["type"] == "accepted"
    end = w.end(job_id)
    assert end["type"] == "error" and end["code"] == "cancelled"


def test_background_request_preempted_by_a_chat_completes_unchanged(client) -> None:
    """A nataraj request over HTTP is paused for a chat and resumes: same text as alone."""
    background = {"model": "tiny-1", "messages": [{"role": "user", "content": "Write a card."}],
                  "max_tokens": 4000, "temperature": 0.8, "seed": 11,
                  "extra_body": {"uniun": {"kind": "nataraj", "flow": "cards"}}}
    alone = client.chat.completions.create(**background)
    assert alone.model_extra["uniun"]["preemptions"] == 0
    assert alone.usage.completion_tokens == 4000  # seconds of work: time for a chat to land
    reference = alone.choices[0].message.content

    pieces: list[str] = []
    final: dict = {}
    streamed = threading.Event()

    def follow() -> None:
        for chunk in client.chat.completions.create(**background, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
                if len(pieces) >= 3:
                    streamed.set()
            if chunk.choices and chunk.choices[0].finish_reason:
                final.update(chunk.model_extra.get("uniun") or {})

    thread = threading.Thread(target=follow)
    thread.start()
    assert streamed.wait(WAIT_S)
    chat = client.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=8)
    assert chat.choices[0].message.content
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert final.get("preemptions", 0) >= 1, final  # the scheduler did pause it
    assert "".join(pieces) == reference


def test_a_client_that_gives_up_on_a_non_streamed_request_cancels_it(rt: Runtime,
                                                                       base_url: str) -> None:
    """With the app in the background the governor parks the request after a quarter of
    its tokens, so it cannot finish before the client's timeout, on any machine."""
    import httpx

    job_id = "http-gives-up-1"
    body = {"model": "tiny-1", "messages": CHAT, "max_tokens": 400, "temperature": 0,
            "uniun": {"job_id": job_id, "kind": "nataraj"}}
    w = rt.wire()
    assert w.request("lifecycle", state="background")["type"] == "ok"
    try:
        with pytest.raises(httpx.TimeoutException):  # 5 s: long enough to be submitted
            httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=5.0)
        wait_for("the request's job to be known", lambda: w.request(
            "attach", job_id=job_id, after_seq=10**6)["type"] == "accepted")
        end = w.end(job_id)
        assert end["type"] == "error" and end["code"] == "cancelled"
    finally:
        assert w.request("lifecycle", state="foreground")["type"] == "ok"


def test_the_gateway_serves_the_prometheus_metrics(rt: Runtime, base_url: str,
                                                  client: openai.OpenAI) -> None:
    """With the gateway running, ``/metrics`` is its route (and the URL in
    ``run/metrics.endpoint``); an embeddings call through it moves the pool's counter."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    endpoint = rt.home / "run" / "metrics.endpoint"
    url = wait_for("the metrics endpoint file", lambda: endpoint.exists()
                   and endpoint.read_text().strip())
    assert url == f"{base_url}/metrics"

    def embeds_ok() -> float:
        with urllib.request.urlopen(url, timeout=WAIT_S) as reply:
            body = reply.read().decode()
        return sum(s.value for fam in text_string_to_metric_families(body)
                   for s in fam.samples
                   if s.name == "uniun_embed_requests_total" and s.labels == {"outcome": "ok"})

    before = embeds_ok()
    client.embeddings.create(model="all-minilm-l6-v2", input=["metrics through the gateway"])
    assert wait_for("the embedding to be counted", lambda: embeds_ok() == before + 1)
