"""The gateway's door, probed from outside: what a web page or a hostile client gets.

Each probe is one request a well-behaved client never sends, built from raw bytes
(``http_wire``), and what is measured is what the issue's table asks: was it answered
(2xx), and, for a body declared far over the limit, how many body bytes the client got
to send before the gateway answered.

- ``foreign_host``: a valid chat with ``Host: evil.example:PORT`` (what a page on a
  DNS-rebinding domain sends);
- ``cross_site_form``: the same with ``Origin: http://evil.example`` and
  ``Content-Type: text/plain`` (a cross-site form post: no CORS preflight in a browser);
- ``text_plain``: a loopback ``Host``, no ``Origin``, ``Content-Type: text/plain``;
- ``foreign_origin``: a loopback ``Host``, ``application/json``, ``Origin:
  http://evil.example``;
- ``declared_256mib``: ``Content-Length: 268435456``. The client sends the headers and
  waits ``HEADERS_ONLY_WAIT_S`` for an answer; only if none came does it stream the
  body, counting bytes, until an answer arrives or ``STREAM_CAP`` bytes are out. The
  count is what the client handed to its socket: an upper bound of what the server read.
"""

from __future__ import annotations

import json
import select
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any

from uniun.runtime.chaos.http_wire import Reply, exchange, parse_reply

__all__ = ["ProbeResult", "run_probes"]

HEADERS_ONLY_WAIT_S = 3.0  # how long the 256 MiB probe waits before sending any body
STREAM_CAP = 64 << 20  # the 256 MiB probe stops sending after this many bytes
DECLARED = 256 << 20  # the body length the probe declares, bytes
ANSWER_WAIT_S = 60.0


@dataclass
class ProbeResult:
    name: str
    status: int | None
    answered: bool  # a 2xx came back: the request was served
    body_bytes_sent: int | None = None  # declared_256mib only
    detail: str = ""


def _request(host_header: bytes, extra: list[tuple[bytes, bytes]], body: bytes,
             length: int | None = None, api_key: str = "") -> bytes:
    headers = [(b"Host", host_header), *extra,
               (b"Content-Length", str(len(body) if length is None else length).encode()),
               (b"Connection", b"close")]
    if api_key:
        headers.append((b"Authorization", b"Bearer " + api_key.encode()))
    head = b"POST /v1/chat/completions HTTP/1.1\r\n" + b"".join(
        n + b": " + v + b"\r\n" for n, v in headers) + b"\r\n"
    return head + body


def _result(name: str, reply: Reply) -> ProbeResult:
    answered = reply.status is not None and 200 <= reply.status < 300
    detail = reply.problem or reply.body[:160].decode("utf-8", "replace")
    return ProbeResult(name, reply.status, answered, detail=detail)


def _declared_huge(host: str, port: int, head: bytes) -> ProbeResult:
    sent = 0
    data = b""
    with socket.create_connection((host, port), timeout=ANSWER_WAIT_S) as sock:
        sock.sendall(head)
        readable, _, _ = select.select([sock], [], [], HEADERS_ONLY_WAIT_S)
        if not readable:
            sock.setblocking(False)
            chunk = b"x" * 65536
            while sent < STREAM_CAP:
                readable, writable, _ = select.select([sock], [sock], [], ANSWER_WAIT_S)
                if readable:
                    break
                if writable:
                    try:
                        sent += sock.send(chunk)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        break
            sock.setblocking(True)
        sock.settimeout(ANSWER_WAIT_S if sent < STREAM_CAP else 10.0)
        deadline = time.monotonic() + ANSWER_WAIT_S
        while time.monotonic() < deadline:
            try:
                piece = sock.recv(65536)
            except (TimeoutError, OSError):
                break
            if not piece:
                break
            data += piece
            if b"\r\n\r\n" in data and len(data) > 4096:
                break
    reply = parse_reply(data) if data else Reply(problem="no answer")
    result = _result("declared_256mib", reply)
    result.body_bytes_sent = sent
    if reply.status is None and sent >= STREAM_CAP:
        result.detail = f"no answer after {sent} body bytes"
    return result


def run_probes(host: str, port: int, model: str, api_key: str = "") -> list[ProbeResult]:
    """Every probe of the module docstring, in order."""
    body = json.dumps({"model": model, "max_tokens": 1, "temperature": 0,
                       "messages": [{"role": "user", "content": "Hi"}]}).encode()
    own = b"127.0.0.1:%d" % port
    as_json = [(b"Content-Type", b"application/json")]
    cases = {
        "foreign_host": (b"evil.example:%d" % port, as_json),
        "cross_site_form": (b"evil.example:%d" % port,
                            [(b"Origin", b"http://evil.example"),
                             (b"Content-Type", b"text/plain")]),
        "text_plain": (own, [(b"Content-Type", b"text/plain")]),
        "foreign_origin": (own, [*as_json, (b"Origin", b"http://evil.example")]),
    }
    results = []
    for name, (host_header, extra) in cases.items():
        raw = _request(host_header, extra, body, api_key=api_key)
        results.append(_result(name, exchange(host, port, raw, timeout_s=ANSWER_WAIT_S)))
    head = _request(own, as_json, b"", length=DECLARED, api_key=api_key)
    results.append(_declared_huge(host, port, head))
    return results


def probes_json(results: list[ProbeResult]) -> dict[str, Any]:
    return {r.name: asdict(r) for r in results}
