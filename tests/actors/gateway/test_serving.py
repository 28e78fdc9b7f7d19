"""The gateway's app served by real uvicorn with the gateway's own protocol
(actors/gateway/serving.py), driven over raw sockets: the size limit holds while reading,
slow headers and slow bodies are cut off, the connection cap answers 429, and what h11
cannot parse is a JSON 400. No runtime: the gateway's scheduler endpoint has nobody
behind it, which no test here reaches (every request is refused before a job)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from tests.wait import WAIT_S, wait_for
from uniun.actors.gateway.app import build_app
from uniun.actors.gateway.gateway import Gateway, GatewaySettings
from uniun.actors.gateway.serving import protocol_class
from uniun.runtime.chaos.http_wire import parse_reply

LIMIT = 4096  # the body limit of these servers, bytes


class Served:
    def __init__(self, tmp_path: Path, *, header_timeout_s: float, read_timeout_s: float,
                 max_connections: int, api_key: str = "") -> None:
        self.gateway = Gateway(GatewaySettings(
            front=f"ipc://{tmp_path}/nobody.sock", embed=None, embed_model="e",
            models_root=tmp_path / "models", max_body_bytes=LIMIT,
            read_timeout_s=read_timeout_s, api_key=api_key))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(
            build_app(self.gateway), log_config=None, access_log=False, lifespan="on",
            http=protocol_class(header_timeout_s, max_connections)))
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True)
        self.thread.start()
        wait_for("uvicorn to start", lambda: self.server.started)

    def connect(self) -> socket.socket:
        conn = socket.create_connection(("127.0.0.1", self.port), timeout=WAIT_S)
        return conn

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT_S)
        self.gateway.close()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    made: list[Served] = []

    def make(header_timeout_s: float = 60.0, read_timeout_s: float = 60.0,
             max_connections: int = 64, api_key: str = "") -> Served:
        made.append(Served(tmp_path, header_timeout_s=header_timeout_s,
                           read_timeout_s=read_timeout_s, max_connections=max_connections,
                           api_key=api_key))
        return made[-1]

    yield make
    for served in made:
        served.close()


def read_answer(conn: socket.socket) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of the one answer on ``conn``."""
    data = b""
    while True:
        piece = conn.recv(65536)
        data += piece
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not piece or (sep and b"content-length:" in head.lower() and len(rest) >= int(
                head.lower().split(b"content-length:")[1].split(b"\r\n")[0])):
            break
    reply = parse_reply(data)
    assert reply.status is not None, data
    return reply.status, json.loads(reply.body)


def closed(conn: socket.socket) -> bool:
    """The server closed ``conn`` (after its answer)."""
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True


HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n")


def test_a_declared_body_over_the_limit_is_413_before_a_byte_of_it(serve) -> None:
    served = serve()
    with served.connect() as conn:
        conn.sendall(HEAD + b"Content-Length: 268435456\r\n\r\n" + b"{")  # and no more
        status, body = read_answer(conn)
        gone = closed(conn)
    assert status == 413 and body["error"]["code"] == "bad_envelope" and gone


def test_a_chunked_body_is_cut_off_at_the_limit(serve) -> None:
    served = serve()
    with served.connect() as conn:
        conn.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 1000
        for _ in range(LIMIT // len(chunk) + 1):  # one chunk past the limit, then wait
            conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        status, _ = read_answer(conn)
        gone = closed(conn)
    assert status == 413 and gone


def test_a_body_under_the_limit_reaches_the_handler(serve) -> None:
    served = serve()
    with served.connect() as conn:
        body = b'{"model": 5}'
        conn.sendall(HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        status, answer = read_answer(conn)
    assert status == 400 and answer["error"]["param"] == "model"  # the mapping saw it


def test_headers_that_never_end_are_cut_off_with_408(serve) -> None:
    served = serve(header_timeout_s=0.5)
    with served.connect() as conn:
        conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1\r\n")
        status, body = read_answer(conn)
        gone = closed(conn)
    assert status == 408 and body["error"]["code"] == "request_timeout" and gone


def test_a_connection_that_sends_nothing_is_closed(serve) -> None:
    served = serve(header_timeout_s=0.5)
    with served.connect() as conn:
        assert conn.recv(1) == b""  # closed by the server, without an answer


def test_slow_headers_after_a_kept_alive_answer_are_cut_off_too(serve) -> None:
    """uvicorn's keep-alive timer stops at the next request's first byte; ours does not."""
    served = serve(header_timeout_s=0.5)
    with served.connect() as conn:
        conn.sendall(b"GET /v1/nothing HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        data = b""
        while b'"not_found"' not in data:
            data += conn.recv(65536)
        assert data.startswith(b"HTTP/1.1 404")
        conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127")
        status, _ = read_answer(conn)
        gone = closed(conn)
    assert status == 408 and gone


def test_a_body_that_does_not_arrive_is_408(serve) -> None:
    served = serve(read_timeout_s=0.5)
    with served.connect() as conn:
        conn.sendall(HEAD + b"Content-Length: 100\r\n\r\n{\"model\"")
        status, _ = read_answer(conn)
        gone = closed(conn)
    assert status == 408 and gone


def test_without_the_api_key_no_body_is_read(serve) -> None:
    """401 comes from the headers alone: the body (announced, never sent) is not awaited."""
    served = serve(api_key="k")
    with served.connect() as conn:
        conn.sendall(HEAD + b"Content-Length: 100\r\n\r\n")
        status, body = read_answer(conn)
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    with served.connect() as conn:
        conn.sendall(HEAD + b"Authorization: Bearer k\r\nContent-Length: 12\r\n\r\n"
                     b'{"model": 5}')
        status, body = read_answer(conn)
    assert status == 400 and body["error"]["param"] == "model"


def test_over_the_connection_cap_a_request_gets_429(serve) -> None:
    served = serve(max_connections=2)
    idle = [served.connect(), served.connect()]
    try:
        wait_for("both idle connections to be accepted",
                 lambda: len(served.server.server_state.connections) == 2)
        with served.connect() as conn:
            conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            status, body = read_answer(conn)
            gone = closed(conn)
        assert status == 429 and body["error"]["code"] == "queue_full" and gone
    finally:
        for conn in idle:
            conn.close()
    wait_for("the idle connections to be gone",
             lambda: len(served.server.server_state.connections) == 0)
    with served.connect() as conn:
        conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        status, body = read_answer(conn)
    assert status == 200 and body["object"] == "list"


@pytest.mark.parametrize("raw", [
    b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\n\r\n",
    b"GET\x00 /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
    b"POST /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -1\r\n\r\n",
    b"GET /\xff HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
])
def test_what_h11_cannot_parse_is_a_json_400(serve, raw: bytes) -> None:
    served = serve()
    with served.connect() as conn:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(raw)
        status, body = read_answer(conn)
    assert 400 <= status < 500 and set(body["error"]) == {"message", "type", "param", "code"}


def test_a_client_still_sending_a_refused_body_reads_the_refusal(serve) -> None:
    """The lingering close: http.client sends all 3 MB before it reads anything; a server
    that closed at once would reset the connection under it, and the 413 would be lost."""
    import http.client

    served = serve()
    for _ in range(10):
        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=WAIT_S)
        try:
            conn.request("POST", "/v1/chat/completions", body=b"x" * (3 << 20),
                         headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            assert reply.status == 413
            assert json.loads(reply.read())["error"]["code"] == "bad_envelope"
        finally:
            conn.close()
