"""The embedding pool as a user of it sees it: real processes, sockets and model.

One pool (2 workers, queue bound 8) serves the whole module, started the way the
supervisor starts it. Nothing here asserts on timing; every wait is generous.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest
import zmq

from uniun.protocol.client import ClientError

pytestmark = pytest.mark.integration


def _texts(tag: str, n: int, words: int = 30) -> list[str]:
    return [f"{tag} item {i}: " + " ".join(f"w{(i * 7 + j) % 97}" for j in range(words))
            for i in range(n)]


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert ((got * want).sum(1) > 0.9999).all()


def test_embed_reply_carries_l2_normalised_float32_vectors(pool, session) -> None:
    texts = ["hello world", "a second, somewhat longer sentence about the weather"]
    with pool.client() as client:
        got = client.embed(texts)
    assert got.dtype == np.float32 and got.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    _assert_same(got, session.embed(texts))


def test_flood_of_200_gets_queue_full_beyond_the_bound_and_the_rest_right(pool,
                                                                        session) -> None:
    before = pool.status()
    batches = [_texts(f"flood{i}", 4) for i in range(200)]
    with pool.client() as client:
        ids = [client.submit(batch) for batch in batches]
        replies = client.wait(ids)
    refused = [r for r in replies.values() if isinstance(r, ClientError)]
    assert refused, "a flood of 200 must overflow a queue bound of 8"
    assert {e.code for e in refused} == {"queue_full"}
    assert all(e.retryable for e in refused)
    accepted = [(batches[k], replies[i]) for k, i in enumerate(ids)
                if isinstance(replies[i], np.ndarray)]
    assert len(accepted) >= 2 + pool.queue_bound  # two running + a full queue, at least
    want = session.embed([t for batch, _ in accepted for t in batch])
    _assert_same(np.concatenate([got for _, got in accepted]), want)
    after = pool.status()
    assert after["rejected_full"] - before["rejected_full"] == len(refused)
    assert after["queued"] == 0 and after["running"] == 0


def test_sigkilled_worker_is_restarted_and_its_request_rerun(pool, session) -> None:
    big = _texts("big", 48, words=40)  # most of a second of work for one worker
    small = [_texts(f"small{i}", 2) for i in range(5)]
    before = pool.status()
    with pool.client() as client:
        big_id = client.submit(big)
        small_ids = [client.submit(batch) for batch in small]
        victim = None
        deadline = time.monotonic() + 120
        while victim is None and time.monotonic() < deadline:
            victim = next((w for w in client.status()["workers"]
                           if w["request"] == big_id), None)
        assert victim is not None, "the big request never started"
        os.kill(victim["pid"], signal.SIGKILL)
        replies = client.wait([big_id, *small_ids])
        after = client.status()
    _assert_same(replies[big_id], session.embed(big))
    for batch, msg_id in zip(small, small_ids):
        _assert_same(replies[msg_id], session.embed(batch))
    # The other worker may have answered everything before the new one has loaded.
    after = pool.wait_ready()
    slot = next(w for w in after["workers"] if w["name"] == victim["name"])
    assert slot["pid"] != victim["pid"] and slot["state"] in ("idle", "busy")
    old = next(w for w in before["workers"] if w["name"] == victim["name"])
    assert slot["restarts"] == old["restarts"] + 1
    assert after["requeued"] == before["requeued"] + 1


def _raw(endpoint: str, frames: list[bytes]) -> list[dict]:
    """Send raw frames on one DEALER; return the decoded replies, one per frame."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        for frame in frames:
            sock.send(frame)
        replies = []
        for _ in frames:
            assert sock.poll(60_000), "the pool did not answer a malformed message"
            replies.append(msgpack.unpackb(sock.recv(), raw=False))
        return replies
    finally:
        sock.close()


def test_malformed_requests_get_the_right_error_codes(pool) -> None:
    def msg(**fields: object) -> bytes:
        return msgpack.packb({"v": 1, "type": "embed", "id": "m", **fields})

    cases = [
        (b"\xc1 not msgpack", "bad_envelope", None),
        (msgpack.packb([1, 2, 3]), "bad_envelope", None),
        (b"\x00" * (2 << 20), "bad_envelope", None),  # over the 1 MiB frame limit
        (msgpack.packb({"v": 2, "type": "embed", "id": "m", "texts": ["x"]}),
         "unsupported_version", "v"),
        (msgpack.packb({"v": 1, "type": "submit", "id": "m", "job": {}}), "unknown_type",
         "type"),
        (msgpack.packb({"v": 1, "type": "embed", "texts": ["x"]}), "invalid_field", "id"),
        (msg(), "invalid_field", "texts"),
        (msg(texts=[]), "invalid_field", "texts"),
        (msg(texts="one string"), "invalid_field", "texts"),
        (msg(texts=["fine", 7]), "invalid_field", "texts[1]"),
        (msg(texts=["x"] * 257), "invalid_field", "texts"),
    ]
    replies = _raw(pool.endpoint, [frame for frame, _, _ in cases])
    for (frame, code, field), reply in zip(cases, replies):
        assert reply["type"] == "error" and reply["code"] == code, (frame[:40], reply)
        assert reply.get("field") == field, reply
        assert reply["v"] == 1 and "message" in reply
    # Still serving; and a request just under the frame limit is served, not refused.
    near_limit = msg(texts=["word " * 200_000])
    assert 1_000_000 < len(near_limit) < 1 << 20
    ok, big = _raw(pool.endpoint, [msg(texts=["still alive"]), near_limit])
    for reply in (ok, big):
        assert reply["type"] == "embeddings" and reply["re"] == "m", reply
        assert len(reply["vectors"]) == 1 and len(reply["vectors"][0]) == 4 * 384


def test_cli_embed_prints_vectors_and_explains_a_missing_pool(pool, tmp_path) -> None:
    cmd = [sys.executable, "-m", "uniun.runtime", "embed"]
    out = subprocess.run([*cmd, "--endpoint", pool.endpoint, "--json", "one", "two"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import json

    vectors = np.array(json.loads(out.stdout)["vectors"])
    assert vectors.shape == (2, 384)
    missing = subprocess.run([*cmd, "--endpoint", f"ipc://{tmp_path}/none.sock", "hi"],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1
    assert "no embedding pool is running" in missing.stderr
    assert "uniun-runtime start" in missing.stderr
