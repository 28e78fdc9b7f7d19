"""The gateway's ASGI app in-process (Starlette's test client over httpx): the API-key
check, OpenAI-shaped errors for bad bodies and unknown routes, and a /health that says
"unavailable" when no scheduler answers -- all without a runtime (a real ``Client`` to an
endpoint where nothing listens)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from uniun.actors.gateway.app import build_app
from uniun.actors.gateway.gateway import Gateway, GatewaySettings

BASE = "http://127.0.0.1:8765"  # a Host the door lets in (Starlette's default is not)


def _gateway(tmp_path: Path, api_key: str = "") -> Gateway:
    return Gateway(GatewaySettings(front=f"ipc://{tmp_path}/nobody.sock", embed=None,
                                   embed_model="e", models_root=tmp_path / "models",
                                   api_key=api_key))


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[TestClient]:
    gateway = _gateway(tmp_path, api_key="s3cret")
    extra = [Route("/metrics", lambda _r: PlainTextResponse("up 1\n"))]
    with TestClient(build_app(gateway, extra_routes=extra), base_url=BASE) as client:
        yield client
    gateway.close()


def test_api_key_is_required_when_set(keyed: TestClient) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        reply = keyed.get("/v1/models", headers=headers)
        assert reply.status_code == 401
        assert reply.json()["error"]["code"] == "invalid_api_key"
    good = keyed.get("/v1/models", headers={"Authorization": "Bearer s3cret"})
    assert good.status_code == 200 and good.json() == {"object": "list", "data": []}


def test_extra_routes_are_mounted_behind_the_key(keyed: TestClient) -> None:
    assert keyed.get("/metrics").status_code == 401
    reply = keyed.get("/metrics", headers={"Authorization": "Bearer s3cret"})
    assert reply.status_code == 200 and reply.text == "up 1\n"


def test_health_is_open_and_unavailable_without_a_scheduler(keyed: TestClient) -> None:
    reply = keyed.get("/health")
    assert reply.status_code == 503
    assert reply.json()["status"] == "unavailable"


def test_errors_have_openai_shape(tmp_path: Path) -> None:
    gateway = _gateway(tmp_path)
    with TestClient(build_app(gateway), base_url=BASE) as client:
        bad = client.post("/v1/chat/completions", content=b"{not json",
                          headers={"Content-Type": "application/json"})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
        missing = client.post("/v1/chat/completions", json={"messages": []})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"
        assert client.get("/v1/nothing").status_code == 404
        assert client.get("/v1/chat/completions").status_code == 405
        gateway.stopping = True
        reply = client.post("/v1/chat/completions",
                            json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
    gateway.close()


def test_embedding_requests_count_against_the_open_request_cap(tmp_path: Path) -> None:
    gateway = _gateway(tmp_path)
    with TestClient(build_app(gateway), base_url=BASE) as client:
        held = [gateway.requests.ticket(f"10.0.0.{i}", chat=True)  # other clients' jobs
                for i in range(gateway.requests.caps.total)]
        for ticket in held:
            ticket.take()
        reply = client.post("/v1/embeddings", json={"model": "e", "input": "hello"})
        assert reply.status_code == 429 and reply.json()["error"]["code"] == "queue_full"
        assert reply.headers["retry-after"] == "1"
        for ticket in held:
            ticket.give_back()
    gateway.close()


def test_embedding_tokens_are_counted_off_the_event_loop(tmp_path: Path) -> None:
    """The pool is a fake here (this room's unit test); the token counter is the
    gateway's own, replaced by one that records which thread it ran on."""
    import threading

    import numpy as np

    gateway = _gateway(tmp_path)
    threads: dict[str, int] = {}

    async def fake_pool_embed(texts: list[str]) -> np.ndarray:
        threads["loop"] = threading.get_ident()
        assert gateway.requests.total == 1  # the request holds a slot while it runs
        return np.zeros((len(texts), 4), dtype=np.float32)

    def count(texts: list[str]) -> int:
        threads["count"] = threading.get_ident()
        return 7

    gateway.link.embed = fake_pool_embed  # type: ignore[method-assign]
    gateway.count_embed_tokens = count  # type: ignore[method-assign]
    with TestClient(build_app(gateway), base_url=BASE) as client:
        reply = client.post("/v1/embeddings", json={"model": "e", "input": ["a", "b"]})
    assert reply.status_code == 200 and reply.json()["usage"]["prompt_tokens"] == 7
    assert threads["count"] != threads["loop"]
    assert gateway.requests.total == 0 and not gateway.requests.by_client
    gateway.close()


def test_a_bug_of_ours_is_a_json_500_without_its_text(tmp_path: Path) -> None:
    def broken(_request: object) -> None:
        raise RuntimeError("/secret/path ipc:///x.sock")

    gateway = _gateway(tmp_path)
    app = build_app(gateway, extra_routes=[Route("/broken", broken)])
    with TestClient(app, base_url=BASE, raise_server_exceptions=False) as client:
        reply = client.get("/broken")
    assert reply.status_code == 500 and reply.json()["error"]["code"] == "internal"
    assert "secret" not in reply.text and "ipc" not in reply.text
    gateway.close()


def test_health_says_nothing_internal(keyed: TestClient, tmp_path: Path) -> None:
    reply = keyed.get("/health")
    assert reply.status_code == 503
    assert "ipc://" not in reply.text and str(tmp_path) not in reply.text
    assert "Error" not in reply.text


@pytest.mark.parametrize(("message", "code"), [
    (("the runner cannot run this job: prompt of 5000 tokens does not fit the model's "
      "4096-position context"), "context_length_exceeded"),
    ("the runner cannot run this job: the prompt has no tokens for this model",
     "invalid_field")])
def test_a_prompt_the_runner_cannot_start_is_the_clients_400(message: str, code: str) -> None:
    from uniun.actors.gateway.link import Outcome
    from uniun.actors.gateway.routes import _failure

    error = _failure(Outcome("event", {"type": "error", "code": "runner_failed",
                                       "message": message, "retryable": False}))
    assert error.status == 400 and error.code == code
    assert "runner cannot" not in error.message
    other = _failure(Outcome("event", {"type": "error", "code": "runner_failed",
                                       "message": "the runner cannot run this job: model x "
                                                  "failed to load", "retryable": False}))
    assert other.status == 503 and "load" not in other.message
