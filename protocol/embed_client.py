"""The embedding pool's client: texts in, ``[n, dim]`` float32 rows out.

Beside :mod:`uniun.protocol.client` (the scheduler's client) rather than inside it,
because the pool is a different server with one request type and no job streams.

Theory of operation:

- One ``EmbedClient`` owns one DEALER connected to the pool (``embed.endpoint`` file,
  else ``ipc://$UNIUN_HOME/run/embed.sock``). Not thread-safe; every wait is a poll
  with a timeout.
- Pipelining: :meth:`submit` sends and returns the message id at once; :meth:`wait`
  collects replies for several ids (routed by ``re``); :meth:`embed` is the two in one.
  Replies are ``np.ndarray`` rows, or a :class:`~uniun.protocol.client.ClientError`
  value (``queue_full`` is retryable, and its ``retry_after_s`` says when to try again)
  -- :meth:`embed` raises it instead.
- No pool: a missing ipc socket file fails at once with :class:`EmbedUnavailable`, and
  so does a socket file nobody listens on (a SIGKILLed pool leaves its file behind; a
  plain ``connect`` to it is refused at once, so the client need not wait out
  ``connect_timeout`` to learn it); a pool that does not complete the ZMTP handshake
  within ``connect_timeout`` likewise.
- The pool restarted (a socket monitor saw the connection drop): requests still waiting
  are sent again on a fresh socket once a pool is back. Embedding is a pure function of
  the texts, so a repeat is harmless; a reply to the first send is simply unmatched.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from uniun.protocol import messages as m
from uniun.protocol.client import ClientError, Timeout
from uniun.protocol.codec import DEFAULT_LIMITS, Limits, encode, try_decode
from uniun.protocol.curve import ClientCurve
from uniun.protocol.dealer import DealerConnection
from uniun.protocol.endpoints import embed_endpoint


class EmbedUnavailable(ConnectionError):
    """No embedding pool at the endpoint; the message says how to start one."""


class EmbedClient(DealerConnection):
    """A connection to the embedding pool. See the module docstring.

    ``timeout``: seconds :meth:`embed` waits for its reply (default 60: a request
    waits behind up to ``queue_bound`` others). ``connect_timeout``: seconds to wait
    for a pool to answer the handshake (default 5).
    """

    def __init__(self, endpoint: str | None = None, timeout: float = 60.0, *,
                 connect_timeout: float = 5.0, limits: Limits = DEFAULT_LIMITS,
                 context: zmq.Context | None = None, curve: ClientCurve | None = None) -> None:
        super().__init__(embed_endpoint(endpoint), linger_ms=0, limits=limits, context=context,
                         send_timeout_ms=int(connect_timeout * 1000), curve=curve)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.resends = 0  # requests sent again after the pool was lost
        self._pending: dict[str, dict[str, Any]] = {}  # id -> request, until answered
        self._replies: dict[str, dict[str, Any]] = {}  # id -> reply, until collected
        self._open()

    # -- public API -----------------------------------------------------------------
    def embed(self, texts: Sequence[str], *, timeout: float | None = None) -> np.ndarray:
        """``[len(texts), dim]`` float32 L2-normalised rows; raises ``ClientError``."""
        msg_id = self.submit(texts)
        result = self.wait([msg_id], timeout=timeout)[msg_id]
        if isinstance(result, ClientError):
            raise result
        return result

    def submit(self, texts: Sequence[str]) -> str:
        """Send one ``embed`` request now; returns its id for :meth:`wait`."""
        if isinstance(texts, str):
            raise TypeError("submit() takes a list of texts, not one string")
        msg = m.req_embed(self._next_id(), list(texts))
        return self._send_request(msg)

    def wait(self, ids: Iterable[str], *, timeout: float | None = None
             ) -> dict[str, np.ndarray | ClientError]:
        """Wait for the replies to ``ids``; raises :class:`Timeout` if one is missing."""
        wanted = list(ids)
        self._pump_until(lambda: all(i in self._replies for i in wanted), timeout,
                         f"{len(wanted)} embed replies")
        return {i: _result(self._replies.pop(i)) for i in wanted}

    def ping(self, *, timeout: float | None = None) -> float:
        """Round-trip time of a ``ping``, seconds."""
        start = time.monotonic()
        msg_id = self._send_request(m.req_ping(self._next_id()))
        self._pump_until(lambda: msg_id in self._replies, timeout, "pong")
        self._replies.pop(msg_id)
        return time.monotonic() - start

    def status(self, *, timeout: float | None = None) -> dict[str, Any]:
        """The pool's ``status`` body: workers (name, pid, state), queue, counters."""
        msg_id = self._send_request(m.req_status(self._next_id()))
        self._pump_until(lambda: msg_id in self._replies, timeout, "status")
        reply = self._replies.pop(msg_id)
        if reply.get("type") == m.ERROR:
            raise ClientError.from_msg(reply)
        return {k: v for k, v in reply.items() if k not in ("v", "type", "re")}

    def close(self) -> None:
        self._pending.clear()
        self._close_socket()

    # -- socket ---------------------------------------------------------------------
    def _send_request(self, msg: dict[str, Any]) -> str:
        frame = encode(msg, self._limits)  # a bad request fails here, before anything is sent
        self._ensure_connected()
        self._pending[msg["id"]] = msg
        self._send_frame(frame)
        return msg["id"]

    def _send_frame(self, frame: bytes) -> None:
        """Send, waiting at most ``connect_timeout`` for room (SNDTIMEO)."""
        assert self._sock is not None
        try:
            self._sock.send(frame)
        except zmq.Again:  # no pool took it in time: treat as lost; pending is re-sent
            self._connected = False

    def _ensure_connected(self) -> None:
        if self._sock is None:
            raise RuntimeError("client is closed")
        if self._connected:
            return
        if self.endpoint.startswith("ipc://"):
            path = self.endpoint[6:]
            if not path.startswith("@") and not Path(path).exists():
                raise EmbedUnavailable(_no_pool(self.endpoint))
            if not _listening(path):
                raise EmbedUnavailable(f"the socket file {path} is stale: nothing listens on "
                                       f"it (a pool that was killed leaves it behind); "
                                       + _no_pool(self.endpoint))
        deadline = time.monotonic() + self.connect_timeout
        while not self._connected:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EmbedUnavailable(_no_pool(self.endpoint))
            self._pump(left)

    def _pump_until(self, done: Any, timeout: float | None, what: str) -> None:
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"{what}: no answer from the embedding pool within {timeout:g}s")
            if not self._connected:
                self._reconnect(deadline)
                continue
            self._pump(min(left, 0.5))

    def _reconnect(self, deadline: float) -> None:
        """Fresh socket; once a pool answers the handshake, send what is pending again."""
        self._close_socket()
        self._open()
        while not self._connected:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EmbedUnavailable(f"lost the embedding pool at {self.endpoint}; "
                                       f"{_no_pool(self.endpoint)}")
            self._pump(min(left, 0.5))
        for msg in self._pending.values():
            self.resends += 1
            self._send_frame(encode(msg, self._limits))

    def _pump(self, timeout_s: float) -> None:
        for parts in self._poll(timeout_s):
            if len(parts) == 1:
                self._route(parts[0])

    def _route(self, frame: bytes) -> None:
        msg = try_decode(frame, self._limits)
        if (isinstance(msg, dict) and isinstance(msg.get("re"), str)
                and self._pending.pop(msg["re"], None) is not None):
            self._replies[msg["re"]] = msg


def _result(reply: dict[str, Any]) -> np.ndarray | ClientError:
    """An ``embeddings`` reply as rows, or the ``error`` reply as a ``ClientError``; a
    ``queue_full`` carries the pool's ``retry_after_s`` hint (seconds, or None)."""
    if reply.get("type") != m.EMBEDDINGS:
        return ClientError.from_msg(reply)
    dim, vectors = reply["dim"], reply["vectors"]
    return np.frombuffer(b"".join(vectors), dtype="<f4").reshape(len(vectors), dim).copy()


def _listening(path: str) -> bool:
    """Whether a process accepts connections on the unix socket ``path``: False for a
    stale file (``ECONNREFUSED``), True otherwise (a full backlog, a permission problem:
    let ZeroMQ find out)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect("\0" + path[1:] if path.startswith("@") else path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True
    finally:
        probe.close()
    return True


def _no_pool(endpoint: str) -> str:
    return (f"no embedding pool is running at {endpoint}. Start the runtime with the pool "
            "enabled (`uniun-runtime start`, config [embed] enabled = true) or run one on "
            "its own: `python -m uniun.runtime.embed_main`")
