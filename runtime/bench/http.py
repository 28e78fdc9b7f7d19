"""Benchmarks of the HTTP door: chat TTFT over HTTP against the ZeroMQ front, and what
constrained decoding costs per token.

* :func:`measure_http` — in a running bench runtime (its gateway on a free port), idle,
  interleaved A/B: a chat over the ZeroMQ front (submit -> first ``token`` event), then
  the same chat over ``POST /v1/chat/completions`` with ``stream: true`` (request sent ->
  first chunk that carries text), ``reps`` times each. Interleaving keeps the machine's
  load the same for both; the ratio of medians is the figure (goal <= 1.2).
* :func:`constrained_cost` — in-process, the real model: an extraction job under its
  JSON schema; per token, the time spent computing and applying the grammar's mask
  against the rest of the decode step, both measured inside the same steps (goal <= 15 %).

The client side is the standard library's ``http.client``: the figure is the gateway's
cost, not an SDK's.
"""

from __future__ import annotations

import http.client
import json
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from uniun.protocol import messages as m
from uniun.protocol.client import Client
from uniun.runtime.state import HTTP_ENDPOINT_FILE

__all__ = ["measure_http", "constrained_cost"]

CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
Log = Callable[[str], None]


def _zmq_ttft(client: Client, model: str) -> float:
    sent = time.monotonic()
    stream = client.submit({"job_id": f"bench-zmq-{uuid.uuid4().hex[:10]}", "kind": "chat",
                            "model_id": model, "messages": CHAT, "max_new_tokens": 8})
    first: float | None = None
    for event in stream:
        if event["type"] == m.TOKEN and first is None:
            first = time.monotonic() - sent
    return first if first is not None else float("nan")


def _http_ttft(url: str, model: str) -> float:
    parsed = urlparse(url)
    assert parsed.hostname, url  # the gateway's own URL always names its host
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
    body = json.dumps({"model": model, "messages": CHAT, "max_tokens": 8, "temperature": 0,
                       "stream": True})
    try:
        sent = time.monotonic()
        conn.request("POST", "/v1/chat/completions", body,
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
        first: float | None = None
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            delta = (chunk.get("choices") or [{}])[0].get("delta", {})
            if delta.get("content") and first is None:
                first = time.monotonic() - sent
        return first if first is not None else float("nan")
    finally:
        conn.close()


def measure_http(run_dir: Path, front: str, model: str, *, reps: int, log: Log) -> dict[str, Any]:
    """Idle chat TTFT over HTTP and over the front, interleaved, in one runtime."""
    url = (run_dir / HTTP_ENDPOINT_FILE).read_text().strip()
    zmq_s: list[float] = []
    http_s: list[float] = []
    with Client(front, timeout=120) as client:
        _zmq_ttft(client, model), _http_ttft(url, model)  # warm-up both paths
        for _ in range(reps):
            zmq_s.append(_zmq_ttft(client, model))
            http_s.append(_http_ttft(url, model))
    z, h = statistics.median(zmq_s), statistics.median(http_s)
    log(f"  chat TTFT idle: ZeroMQ {z * 1e3:.1f} ms, HTTP {h * 1e3:.1f} ms ({h / z:.2f}x)")
    return {"url": url, "ttft_zmq_s": z, "ttft_http_s": h, "http_over_zmq": h / z,
            "samples": {"zmq": zmq_s, "http": http_s}}


def constrained_cost(model_dir: Path, *, reps: int = 3, log: Log) -> dict[str, Any]:
    """Per-token cost of the grammar mask against the rest of a decode step."""
    from uniun.actors.producers.extraction import EXTRACTION_FORMAT, extraction_messages
    from uniun.actors.producers.samples import SAMPLE_NOTES
    from uniun.models.session import DecoderSession

    session = DecoderSession.load(model_dir, threads=2)
    note = SAMPLE_NOTES["ada-lovelace.md"]
    ratios: list[float] = []
    mask_s: list[float] = []
    rest_s: list[float] = []
    build_s: list[float] = []
    for _ in range(reps):
        gen = session.start(messages=extraction_messages(note, title="Ada Lovelace"),
                            max_new_tokens=256, format=EXTRACTION_FORMAT)
        session.prefill(gen)
        while not gen.finished:
            c = gen.constraint
            assert c is not None
            before = c.mask_s
            t0 = time.perf_counter()
            session.step(gen)
            step = time.perf_counter() - t0
            masked = c.mask_s - before
            if c.masks > 1:  # the first mask also builds the matcher (timed apart)
                mask_s.append(masked)
                rest_s.append(step - masked)
                ratios.append(masked / (step - masked))
        build_s.append(gen.constraint.build_s)  # type: ignore[union-attr]
    share = statistics.median(ratios)
    log(f"  constrained decoding: mask {statistics.median(mask_s) * 1e6:.0f} us/token, rest "
        f"of the step {statistics.median(rest_s) * 1e3:.1f} ms ({share:.1%})")
    return {"mask_us_per_token": statistics.median(mask_s) * 1e6,
            "step_ms_without_mask": statistics.median(rest_s) * 1e3,
            "mask_share_of_step": share, "build_ms": statistics.median(build_s) * 1e3,
            "tokens": len(ratios)}
