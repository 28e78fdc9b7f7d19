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
