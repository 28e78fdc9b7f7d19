"""Benchmark: a chat's time-to-first-token during a burst of small submissions.

``python -m uniun.runtime.bench.burst [--model M] [--submits N] [--reps R] [--out FILE]``

One runtime (scheduler and runner only) over a temporary home with the shared model
store. Per repetition a raw protocol client (one DEALER, msgpack maps, nothing of the
product's client) sends ``N`` small ``nataraj`` submits as fast as ZeroMQ takes them,
then one chat, and times the chat from its send to its first ``token``. What it checks
is that control (the chat, the runner's reports) is not queued behind bulk in the
scheduler's inbox. It also reports the chat TTFT with nothing queued, and how long
the whole burst took to be acknowledged.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import msgpack
import zmq

from uniun.runtime.bench.launch import launched

# One client sends the whole burst: no client share below the cap, and the cap leaves
# the chat its reserve (limits.chat_reserve_share) beside the burst.
CONFIG = ('[models]\nchat_model = "{model}"\n[limits]\nqueue_cap = {cap}\n'
          "client_share = 1.0\n"
          "[producers]\nextract = false\nnataraj = false\ngana = false\n"
          "background_gana = false\n[embed]\nenabled = false\n[http]\nport = 0\n")
WAIT_S = 300.0


class RawClient:
    """One DEALER speaking protocol v1 maps; no retries, no reconnects."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self._n = 0

    def send(self, mtype: str, **body: Any) -> str:
        self._n += 1
        msg_id = f"r{self._n}"
        self.sock.send(msgpack.packb({"v": 1, "type": mtype, "id": msg_id, **body},
                                     use_bin_type=True))
        return msg_id

    def recv(self, timeout_s: float) -> dict[str, Any] | None:
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        return msgpack.unpackb(self.sock.recv(), raw=False)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def _chat(model: str) -> dict[str, Any]:
    return {"job_id": f"burst-chat-{uuid.uuid4().hex[:8]}", "kind": "chat",
            "model_id": model, "max_new_tokens": 4,
            "messages": [{"role": "user", "content": "Say hi."}]}


def _ttft(client: RawClient, chat: dict[str, Any], bulk_ids: set[str] | None = None
          ) -> tuple[float, float | None]:
    """Send the chat; (seconds to its first token, seconds until every bulk accepted)."""
    sent = time.monotonic()
    client.send("submit", job=chat)
    first: float | None = None
    acked = 0
    all_acked: float | None = None if bulk_ids else 0.0
    deadline = sent + WAIT_S
    while time.monotonic() < deadline:
        msg = client.recv(1.0)
        if msg is None:
            continue
        job_id = msg.get("job_id")
        if bulk_ids and msg.get("type") in ("accepted", "error") and job_id in bulk_ids:
            acked += 1
            if acked == len(bulk_ids):
                all_acked = time.monotonic() - sent
        if job_id == chat["job_id"] and msg.get("type") == "token" and first is None:
            first = time.monotonic() - sent
        if first is not None and all_acked is not None:
            break
    if first is None:
        raise RuntimeError(f"chat {chat['job_id']} streamed no token")
    return first, all_acked


def run(model: str, submits: int, reps: int, log: Callable[[str], None]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="uniun-bench-burst-", dir="/tmp") as tmp:
        home = Path(tmp)
        config = CONFIG.format(model=model, cap=(submits * (reps + 1) + 100) * 10 // 9 + 1)
        with launched(home, config) as proc, closing(RawClient(
                f"ipc://{home / 'run' / 'front.sock'}")) as client:
            deadline = time.monotonic() + WAIT_S
            while True:
                client.send("status")
                msg = client.recv(2.0)
                if msg and msg.get("type") == "status" and msg.get("ready"):
                    break
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the runtime did not become ready")
            idle = [_ttft(client, _chat(model))[0] for _ in range(3)]
            log(f"burst: idle chat TTFT {statistics.median(idle):.3f}s")
            ttfts: list[float] = []
            acks: list[float] = []
            for rep in range(reps):
                ids = {f"burst-{rep}-{i}" for i in range(submits)}
                t0 = time.monotonic()
                for job_id in sorted(ids):
                    client.send("submit", job={"job_id": job_id, "kind": "nataraj",
                                               "prompt": "x", "max_new_tokens": 1,
                                               "model_id": model, "stream": False})
                sent_s = time.monotonic() - t0
                first, acked = _ttft(client, _chat(model), ids)
                ttfts.append(first)
                acks.append(acked or 0.0)
                log(f"burst {rep + 1}/{reps}: {submits} submits sent in {sent_s:.2f}s; chat "
                    f"first token after {first:.3f}s; all acknowledged after "
                    f"{acked or 0:.2f}s")
            return {"submits": submits, "reps": reps, "model": model,
                    "idle_ttft_p50_s": statistics.median(idle),
                    "burst_ttft_p50_s": statistics.median(ttfts),
                    "burst_ttft_max_s": max(ttfts),
                    "burst_ttft_all_s": [round(t, 4) for t in ttfts],
                    "burst_acked_s": [round(t, 3) for t in acks]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uniun.runtime.bench.burst")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--submits", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/chat-ttft-burst.json"))
    args = parser.parse_args(argv)
    result = run(args.model, args.submits, args.reps,
                 lambda line: print(line, file=sys.stderr, flush=True))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
