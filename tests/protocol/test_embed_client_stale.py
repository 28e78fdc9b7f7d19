"""The embedding client facing a pool that was SIGKILLed: its socket file stays behind.

A ZeroMQ DEALER would keep retrying the dead path until ``connect_timeout`` (5 s by
default); the client must instead say at once that no pool listens there.
"""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import pytest
import zmq

from uniun.protocol.embed_client import EmbedClient, EmbedUnavailable


def test_a_stale_socket_file_is_a_clear_error_not_a_wait_for_the_handshake() -> None:
    with tempfile.TemporaryDirectory(prefix="ues-") as tmp:
        path = Path(tmp) / "embed.sock"
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(str(path))  # what a killed pool leaves: the file, and nobody listening
        dead.close()
        assert path.exists()
        # Waiting out the handshake would end in "no embedding pool is running" too, but
        # without the word "stale": only the liveness probe says that.
        client = EmbedClient(f"ipc://{path}", connect_timeout=60.0)
        try:
            with pytest.raises(EmbedUnavailable, match="stale"):
                client.embed(["hello"])
        finally:
            client.close()


def test_a_listening_pool_socket_is_not_mistaken_for_a_stale_one() -> None:
    with tempfile.TemporaryDirectory(prefix="ues-") as tmp:
        endpoint = f"ipc://{tmp}/embed.sock"
        ctx = zmq.Context.instance()
        router = ctx.socket(zmq.ROUTER)
        router.bind(endpoint)
        try:
            client = EmbedClient(endpoint, timeout=30.0, connect_timeout=30.0)
            try:
                msg_id = client.submit(["hello"])  # connects: the probe found a listener
                assert msg_id
            finally:
                client.close()
        finally:
            router.close(0)
