"""An embedding flood leaves scheduler work and chat unaffected in correctness.

One runtime (scheduler, runner, embedding pool with a small queue bound; tiny chat
model). A chat and a background job run once on a quiet runtime for reference, then
again while 200 embedding requests flood the pool: the scheduler's answers must be the
same, token for token, and the pool must refuse the overflow with ``queue_full`` while
answering everything it accepted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.actors.producers.mesh import Mesh, Wire
from tests.wait import wait_for
from uniun.protocol.client import ClientError
from uniun.protocol.embed_client import EmbedClient

pytestmark = pytest.mark.integration

CONFIG = """
[producers]
extract = false
nataraj = false
gana = false
background_gana = false
samples = false

[embed]
enabled = true
workers = 2
queue_bound = 8
"""
CHAT = {"kind": "chat", "max_new_tokens": 24,
        "messages": [{"role": "user", "content": "Tell me about the sea."}]}
BACKGROUND = {"kind": "nataraj", "max_new_tokens": 300, "prompt": "Write a card about tides."}


def _run(wire: Wire, job_id: str, job: dict[str, Any]) -> tuple[str, list[int]]:
    accepted = wire.request("submit", job={"job_id": job_id, **job})
    assert accepted["type"] == "accepted", accepted
    done = wire.end(job_id)
    assert done["type"] == "done", done
    seqs = [m["seq"] for m in wire.events(job_id) if m["type"] == "token"]
    return done["text"], seqs


def test_embedding_flood_leaves_chat_and_scheduler_work_unaffected(
        tmp_path: Path, tiny_model: str) -> None:
    mesh = Mesh(tmp_path / "home", CONFIG).start()
    try:
        wire = mesh.wire()
        chat_ref, _ = _run(wire, "chat-ref", CHAT)
        bg_ref, _ = _run(wire, "bg-ref", BACKGROUND)

        embed = EmbedClient(f"ipc://{mesh.home / 'run' / 'embed.sock'}", timeout=120)
        wait_for("the embedding pool", lambda: _pings(embed))
        batches = [[f"flood {i} sentence {j} about tides and sea" for j in range(4)]
                   for i in range(200)]
        ids = [embed.submit(batch) for batch in batches]  # all in flight at once
        wire.send("submit", job={"job_id": "bg-flood", **BACKGROUND})
        chat_text, chat_seqs = _run(wire, "chat-flood", CHAT)
        bg_done = wire.end("bg-flood")
        replies = embed.wait(ids)
        embed.close()

        assert chat_text == chat_ref and chat_seqs == list(range(len(chat_seqs)))
        assert bg_done["type"] == "done" and bg_done["text"] == bg_ref
        bg_seqs = [m["seq"] for m in wire.events("bg-flood") if m["type"] == "token"]
        assert bg_seqs == list(range(bg_done["usage"]["completion_tokens"]))
        refused = [r for r in replies.values() if isinstance(r, ClientError)]
        answered = [r for r in replies.values() if isinstance(r, np.ndarray)]
        assert refused and {e.code for e in refused} == {"queue_full"}
        assert len(answered) + len(refused) == 200 and len(answered) >= 8  # the queue bound
        for vectors in answered:
            assert vectors.shape == (4, 384)
            np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    finally:
        code = mesh.stop()
        assert code == 0, mesh.logs()


def _pings(client: EmbedClient) -> bool:
    try:
        client.ping(timeout=2.0)
        return True
    except Exception:  # noqa: BLE001 - not up yet: the pool loads its model after the supervisor starts it
        return False
