"""The supervisor's metrics listener behind the gateway's door (runtime/metrics_http.py,
actors/gateway/door.py), driven with ``http.client``: a foreign Host or Origin is
refused, only GET /metrics is served, and every refusal is a JSON error object."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from uniun.runtime.metrics_http import MetricsServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[MetricsServer]:
    served = MetricsServer(tmp_path, "127.0.0.1", 0, allowed_hosts=["metrics.lan"]).start()
    yield served
    served.stop()


def ask(server: MetricsServer, method: str = "GET", path: str = "/metrics",
        headers: dict[str, str] | None = None, body: bytes | None = None
        ) -> tuple[int, bytes]:
    host, port = server.url.split("//")[1].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in (headers or {"Host": f"127.0.0.1:{port}"}).items():
            conn.putheader(name, value)
        conn.endheaders(body)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def error_code(body: bytes) -> str:
    doc = json.loads(body)
    assert set(doc["error"]) == {"message", "type", "param", "code"}
    return doc["error"]["code"]


def test_loopback_and_configured_names_are_served(server: MetricsServer) -> None:
    port = server.url.split(":")[2].split("/")[0]
    for host in (f"127.0.0.1:{port}", "localhost", f"[::1]:{port}", "metrics.lan"):
        status, body = ask(server, headers={"Host": host})
        assert status == 200 and b"# HELP" in body, host


def test_a_foreign_host_is_421(server: MetricsServer) -> None:
    status, body = ask(server, headers={"Host": "evil.example"})
    assert status == 421 and error_code(body) == "invalid_host"


def test_a_foreign_origin_is_403(server: MetricsServer) -> None:
    port = server.url.split(":")[2].split("/")[0]
    status, body = ask(server, headers={"Host": f"127.0.0.1:{port}",
                                        "Origin": "http://evil.example"})
    assert status == 403 and error_code(body) == "invalid_origin"
    status, _ = ask(server, headers={"Host": f"127.0.0.1:{port}",
                                     "Origin": f"http://127.0.0.1:{port}"})
    assert status == 200


def test_other_methods_paths_and_bodies_are_4xx_json(server: MetricsServer) -> None:
    port = server.url.split(":")[2].split("/")[0]
    own = {"Host": f"127.0.0.1:{port}"}
    status, body = ask(server, "POST", headers={**own, "Content-Type": "application/json",
                                               "Content-Length": "0"})
    assert status == 405 and error_code(body) == "method_not_allowed"
    status, body = ask(server, "POST", headers={**own, "Content-Type": "application/json",
                                               "Content-Length": "2"}, body=b"{}")
    assert status == 413  # a scrape has no body: none is read
    status, body = ask(server, "BREW", headers=own)
    assert status == 405
    status, body = ask(server, "POST", headers={**own, "Content-Type": "text/plain",
                                               "Content-Length": "2"}, body=b"{}")
    assert status == 415
    status, body = ask(server, path="/other", headers=own)
    assert status == 404 and error_code(body) == "not_found"


def test_a_malformed_request_line_is_a_json_400(server: MetricsServer) -> None:
    host, port = server.url.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(b"GARBAGE\r\n\r\n")
        data = b""
        while piece := conn.recv(65536):
            data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.") and b" 400 " in head.split(b"\r\n")[0]
    assert error_code(body) == "bad_envelope"
