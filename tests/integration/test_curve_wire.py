"""A tcp front with CURVE, end to end: keys made by ``uniun-runtime keys``, the runtime's
own CLI served with this home's key, an allowed client served, an unknown key and a
client without keys refused, a revoked key refused from its next connection; a front
other machines could reach, without keys, refused at start with the fix; and the
embedding pool's tcp endpoint under the same keys."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.wait import wait_for
from uniun.actors.scheduler.status import HIDDEN
from uniun.protocol.client import Client, SchedulerUnavailable, Timeout
from uniun.protocol.curve import ClientCurve, KeyPaths, create_pair
from uniun.protocol.embed_client import EmbedClient, EmbedUnavailable
from uniun.protocol.jobstream import ClientError

from .harness import BASE_CONFIG, Runtime

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "uniun.runtime", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_front_other_machines_can_reach_needs_keys_to_start(tmp_path: Path) -> None:
    rt = Runtime(tmp_path / "open")
    out = _cli(rt.env, "start", "--config", str(rt.config_path),
               "--front", f"tcp://0.0.0.0:{_free_port()}")
    assert out.returncode == 2, out.stderr
    assert "uniun-runtime keys init" in out.stderr and "127.0.0.1" in out.stderr
    assert not (rt.home / "run" / "front.endpoint").exists()


def test_curve_front_serves_allowed_keys_only(tmp_path: Path, tiny_model: str) -> None:
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    rt = Runtime(tmp_path / "curve", BASE_CONFIG + f'\n[front]\nendpoint = "{endpoint}"\n')
    assert _cli(rt.env, "keys", "init").returncode == 0
    made = _cli(rt.env, "keys", "create", "alice")
    assert made.returncode == 0, made.stderr
    keys = KeyPaths(rt.home / "keys")
    rt.endpoint = endpoint
    rt.curve = ClientCurve.from_files(keys.client_secret("local"), keys.server_public)
    rt.start()
    try:
        status = _cli(rt.env, "status")  # this home's CLI finds its own key
        assert status.returncode == 0, status.stderr
        alice = ClientCurve.from_files(keys.client_secret("alice"), keys.server_public)
        with Client(endpoint, timeout=30, curve=alice) as client:
            done = client.submit({"kind": "extract", "prompt": "hi", "max_new_tokens": 3}
                                 ).result(timeout=60)
            assert done["type"] == "done"
        _, stranger_secret = create_pair(tmp_path / "elsewhere", "stranger")
        stranger = ClientCurve.from_files(stranger_secret, keys.server_public)
        for curve in (stranger, None):
            with (Client(endpoint, timeout=30, reconnect=False, curve=curve) as client,
                  pytest.raises(SchedulerUnavailable)):
                client.ping()
        with (Client(endpoint, timeout=30, reconnect=False, curve=stranger) as client,
              pytest.raises(SchedulerUnavailable, match="refused this client's key")):
            client.status()
        assert _cli(rt.env, "keys", "revoke", "alice").returncode == 0
        with (Client(endpoint, timeout=30, reconnect=False, curve=alice) as client,
              pytest.raises(SchedulerUnavailable, match="refused")):
            client.ping()
    finally:
        assert rt.stop() == 0, rt.logs()


def test_curve_embedding_pool_serves_allowed_keys_only(tmp_path: Path, tiny_model: str,
                                                       minilm_dir: Path) -> None:
    """The pool's tcp endpoint takes the same keys as the front: an allowed client's
    texts are embedded, an unknown key and a client without keys get nothing."""
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    config = BASE_CONFIG.replace("[embed]\nenabled = false",
                                 f'[embed]\nenabled = true\nworkers = 1\nendpoint = "{endpoint}"')
    rt = Runtime(tmp_path / "curve-embed", config)
    rt.env["UNIUN_CHILDREN"] = "scheduler,runner,embed"
    assert _cli(rt.env, "keys", "init").returncode == 0
    assert _cli(rt.env, "keys", "create", "alice").returncode == 0
    keys = KeyPaths(rt.home / "keys")
    rt.start()
    try:
        wait_for("the embedding pool bound", (rt.home / "run" / "embed.endpoint").is_file)
        assert (rt.home / "run" / "embed.endpoint").read_text().strip() == endpoint
        alice = ClientCurve.from_files(keys.client_secret("alice"), keys.server_public)
        with EmbedClient(endpoint, timeout=120, curve=alice) as pool:
            vectors = pool.embed(["a note for an allowed client"], timeout=120)
            assert vectors.shape == (1, 384)
        _, stranger_secret = create_pair(tmp_path / "elsewhere", "stranger")
        stranger = ClientCurve.from_files(stranger_secret, keys.server_public)
        for curve in (stranger, None):
            # The refusal is a handshake that never completes; an accepted one takes
            # milliseconds against this warm, idle pool, so a short wait cannot pass wrongly.
            with (EmbedClient(endpoint, timeout=3, connect_timeout=1.5, curve=curve) as pool,
                  pytest.raises((Timeout, EmbedUnavailable))):
                pool.embed(["a note for nobody"], timeout=3)
    finally:
        assert rt.stop() == 0, rt.logs()
    # A graceful stop, not the supervisor's kill: CURVE's authenticator lives on the pool's
    # context and must end before the context can.
    assert "embedding pool stopped" in (rt.home / "logs" / "embed.log").read_text(), rt.logs()


def test_over_curve_a_job_belongs_to_the_key_that_submitted_it(tmp_path: Path,
                                                                tiny_model: str) -> None:
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    rt = Runtime(tmp_path / "owners", BASE_CONFIG + f'\n[front]\nendpoint = "{endpoint}"\n')
    assert _cli(rt.env, "keys", "init").returncode == 0
    for name in ("alice", "bob"):
        assert _cli(rt.env, "keys", "create", name).returncode == 0
    keys = KeyPaths(rt.home / "keys")
    rt.endpoint = endpoint
    rt.curve = ClientCurve.from_files(keys.client_secret("local"), keys.server_public)
    rt.start()
    alice_key = ClientCurve.from_files(keys.client_secret("alice"), keys.server_public)
    bob_key = ClientCurve.from_files(keys.client_secret("bob"), keys.server_public)
    try:
        with Client(endpoint, timeout=30, curve=alice_key) as alice, \
                Client(endpoint, timeout=30, curve=bob_key) as bob:
            # In the background lifecycle the job runs a quarter of its tokens, then it is
            # held: alive, and not going anywhere until the foreground comes back.
            alice.lifecycle("background")
            alice.submit({"job_id": "alices", "kind": "nataraj", "prompt": "hello world",
                          "max_new_tokens": 40})
            wait_for("alice's job held", lambda: "alices" in alice.status()["held"])
            for attempt in (lambda: bob.attach("alices").result(timeout=30),
                            lambda: bob.cancel("alices")):
                with pytest.raises(ClientError) as err:
                    attempt()
                assert err.value.code == "not_found"
            seen_by_bob = bob.status()
            assert "alices" not in str(seen_by_bob)
            assert seen_by_bob["held"] == [HIDDEN]
            assert alice.status()["held"] == ["alices"]
            assert alice.cancel("alices")["type"] == "cancelled"
            alice.lifecycle("foreground")
    finally:
        assert rt.stop() == 0, rt.logs()
