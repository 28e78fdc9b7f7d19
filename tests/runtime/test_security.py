"""CURVE on tcp: the key files, who may bind where, and a real handshake per key.

Real ZeroMQ sockets over loopback TCP with the server setup the front and the embedding
pool use (runtime/security.py); the end-to-end version with a whole runtime is
tests/integration/test_curve_wire.py.
"""

from __future__ import annotations

import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from uniun.protocol.curve import (
    ClientCurve,
    CurveError,
    KeyPaths,
    allow,
    allowed_keys,
    create_pair,
    revoke,
)
from uniun.runtime.security import (
    InsecureEndpoint,
    ServerSecurity,
    check_bind,
    client_curve,
)

WAIT_MS = 10_000  # generous: a reply that should come
REFUSED_MS = 2_000  # how long a refused client is given to (not) get one


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def paths(tmp_path: Path) -> KeyPaths:
    p = KeyPaths(tmp_path / "keys")
    create_pair(p.root, "server")
    return p


def test_key_files_are_private_and_the_allow_list_holds_public_halves(paths: KeyPaths) -> None:
    public, secret = create_pair(paths.clients, "alice")
    assert _mode(paths.root) == 0o700 and _mode(paths.clients) == 0o700
    assert _mode(public) == _mode(secret) == 0o600
    assert _mode(paths.server_secret) == 0o600
    allowed = allow(paths, secret, "alice")  # given the secret file: only its public half
    assert _mode(allowed) == 0o600 and "secret" not in allowed.read_text()
    assert list(allowed_keys(paths)) == ["alice"]
    with pytest.raises(CurveError, match="already exists"):
        create_pair(paths.clients, "alice")
    with pytest.raises(CurveError, match="key name"):
        create_pair(paths.clients, "../evil")
    revoke(paths, "alice")
    assert allowed_keys(paths) == {}


def test_tcp_off_loopback_without_a_server_key_is_refused_with_the_fix(tmp_path: Path) -> None:
    bare = KeyPaths(tmp_path / "nokeys")
    assert check_bind("ipc:///tmp/x.sock", "front", bare) == "ipc"
    assert check_bind("tcp://127.0.0.1:5555", "front", bare) == "plain"
    with pytest.raises(InsecureEndpoint, match="keys init"):
        check_bind("tcp://0.0.0.0:5555", "front", bare)
    create_pair(bare.root, "server")
    assert check_bind("tcp://0.0.0.0:5555", "front", bare) == "curve"
    assert check_bind("tcp://127.0.0.1:5555", "front", bare) == "curve"


class _EchoServer:
    """A ROUTER with the front's CURVE setup that answers every frame with b"pong"."""

    def __init__(self, paths: KeyPaths) -> None:
        self.ctx = zmq.Context()
        self.security = ServerSecurity(paths, "test front")
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.security(self.sock)
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self.sock.poll(100):
                ident, _ = self.sock.recv_multipart()
                self.sock.send_multipart([ident, b"pong"])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close(0)
        self.security.stop()
        self.ctx.term()


@pytest.fixture
def server(paths: KeyPaths) -> Iterator[_EchoServer]:
    s = _EchoServer(paths)
    yield s
    s.close()


def _ask(endpoint: str, curve: ClientCurve | None, wait_ms: int,
         expect_event: int | None = None) -> tuple[bytes | None, set[int]]:
    """One request from a fresh DEALER: the reply (or None) and the monitor events seen,
    reading the monitor up to ``WAIT_MS`` more for ``expect_event`` (a slow handshake)."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        curve.apply(sock)
    mon = sock.get_monitor_socket()
    sock.connect(endpoint)
    events: set[int] = set()
    try:
        sock.send(b"ping")
        reply = sock.recv() if sock.poll(wait_ms) else None
        deadline = time.monotonic() + WAIT_MS / 1000
        while True:
            waiting = expect_event is not None and expect_event not in events
            left_ms = int((deadline - time.monotonic()) * 1000) if waiting else 0
            if not mon.poll(max(0, left_ms)):
                return reply, events
            events.add(recv_monitor_message(mon)["event"])
    finally:
        sock.disable_monitor()
        mon.close(0)
        sock.close(0)


def _client(paths: KeyPaths, name: str, *, allowed: bool) -> ClientCurve:
    public, secret = create_pair(paths.clients, name)
    if allowed:
        allow(paths, public, name)
    return ClientCurve.from_files(secret, paths.server_public)


def test_an_allowed_key_is_served_and_an_unknown_one_refused(paths: KeyPaths,
                                                           server: _EchoServer) -> None:
    good = _client(paths, "good", allowed=True)
    stranger = _client(paths, "stranger", allowed=False)
    assert _ask(server.endpoint, good, WAIT_MS)[0] == b"pong"
    reply, events = _ask(server.endpoint, stranger, REFUSED_MS,
                         expect_event=zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    assert reply is None and zmq.EVENT_HANDSHAKE_FAILED_AUTH in events
    plain_reply, _ = _ask(server.endpoint, None, REFUSED_MS)  # no keys at all
    assert plain_reply is None


def test_a_revoked_key_is_refused_from_its_next_connection(paths: KeyPaths,
                                                         server: _EchoServer) -> None:
    bob = _client(paths, "bob", allowed=True)
    assert _ask(server.endpoint, bob, WAIT_MS)[0] == b"pong"
    revoke(paths, "bob")
    assert _ask(server.endpoint, bob, REFUSED_MS)[0] is None
    allow(paths, paths.clients / "bob.key", "bob")  # and back, with no server restart
    assert _ask(server.endpoint, bob, WAIT_MS)[0] == b"pong"


def test_client_curve_finds_this_homes_keys_and_ipc_needs_none(paths: KeyPaths) -> None:
    assert client_curve("ipc:///tmp/x.sock", paths=paths) is None
    assert client_curve("tcp://127.0.0.1:1", paths=paths) is None  # no local client key yet
    _public, _ = create_pair(paths.clients, "local")
    found = client_curve("tcp://127.0.0.1:1", paths=paths)
    assert found is not None and found.public == ClientCurve.from_files(
        paths.client_secret("local"), paths.server_public).public


def test_the_client_reports_a_refused_key_at_once_not_at_its_timeout(
        paths: KeyPaths, server: _EchoServer) -> None:
    """A user whose key was revoked learns it from the first handshake, with the reason,
    instead of staring at a command that hangs for its whole timeout."""
    from uniun.protocol.client import Client, SchedulerUnavailable

    stranger = _client(paths, "stranger", allowed=False)
    began = time.monotonic()
    with (Client(server.endpoint, timeout=120, curve=stranger) as client,
          pytest.raises(SchedulerUnavailable, match="refused this client's key")):
        client.ping()
    assert time.monotonic() - began < 60  # half the timeout: a wait would take all of it
