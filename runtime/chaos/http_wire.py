"""A raw HTTP/1.1 exchange over a socket: bytes out as drafted, the answer parsed here.

Why not an HTTP library: the fuzzer must send what no well-behaved client sends (a
foreign ``Host``, bytes that are not a header, a ``Content-Length`` that lies, a body
that is not JSON under any content type), and it must see what the server really
answered, bytes and all, without a library repairing or refusing either side. Every
request carries ``Connection: close``, so the answer ends where the connection does,
and parsing it is a status line, header lines, and a body that may be chunked.

No Hypothesis here: :mod:`.http_probes` uses it too.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["MAX_REPLY_BYTES", "Reply", "exchange", "split_base_url"]

MAX_REPLY_BYTES = 8 << 20  # an answer longer than this is cut (and reported), bytes


@dataclass
class Reply:
    """What came back. ``status`` is None when no parsable answer arrived (``problem``)."""

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names, last wins
    body: bytes = b""
    problem: str | None = None  # "no answer", "timeout", "unparsable: ...", ...
    seconds: float = 0.0


def split_base_url(url: str) -> tuple[str, int]:
    """(host, port) of ``http://host:port[/...]``."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"not an http:// URL: {url!r}")
    return parts.hostname, parts.port or 80


def _read_all(sock: socket.socket, deadline: float) -> tuple[bytes, str | None]:
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), "timeout"
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return b"".join(chunks), "timeout"
        except ConnectionResetError:
            return b"".join(chunks), None if chunks else "reset"
        if not data:
            return b"".join(chunks), None
        chunks.append(data)
        size += len(data)
        if size > MAX_REPLY_BYTES:
            return b"".join(chunks), f"answer over {MAX_REPLY_BYTES} bytes"


def _dechunk(data: bytes) -> bytes:
    out: list[bytes] = []
    rest = data
    while True:
        line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            raise ValueError("chunk size line without CRLF")
        size = int(line.split(b";")[0].strip() or b"x", 16)
        if size == 0:
            return b"".join(out)
        out.append(rest[:size])
        if len(rest) < size + 2:
            raise ValueError("chunked body cut short")
        rest = rest[size + 2:]


def parse_reply(data: bytes, *, head_only: bool = False) -> Reply:
    """Parse one complete answer (the connection closed after it)."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return Reply(problem=f"unparsable: no end of headers in {data[:80]!r}")
    lines = head.split(b"\r\n")
    status_line = lines[0].split(b" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1.") \
            or not status_line[1].isdigit():
        return Reply(problem=f"unparsable status line {lines[0][:80]!r}")
    status = int(status_line[1])
    if 100 <= status < 200 and status != 101:  # an interim answer (100 Continue)
        return parse_reply(body, head_only=head_only)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            return Reply(status, problem=f"unparsable header line {line[:80]!r}")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    if head_only:
        body = b""
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        try:
            body = _dechunk(body)
        except ValueError as err:
            return Reply(status, headers, body, problem=f"bad chunked body: {err}")
    elif "content-length" in headers:
        length = int(headers["content-length"])
        if len(body) < length:
            return Reply(status, headers, body,
                         problem=f"body of {len(body)} bytes, {length} announced")
        body = body[:length]
    return Reply(status, headers, body)


def exchange(host: str, port: int, raw: bytes, *, timeout_s: float,
             head_only: bool = False) -> Reply:
    """Send ``raw`` (one whole request, ``Connection: close``) and read the answer."""
    started = time.monotonic()
    deadline = started + timeout_s
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as err:
        return Reply(problem=f"cannot connect: {err}", seconds=time.monotonic() - started)
    try:
        try:
            sock.sendall(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before taking it all: read the answer
        data, problem = _read_all(sock, deadline)
    finally:
        sock.close()
    reply = parse_reply(data, head_only=head_only) if data else Reply(problem="no answer")
    if problem and (reply.status is None or problem != "reset"):
        reply.problem = reply.problem or problem
    reply.seconds = time.monotonic() - started
    return reply
