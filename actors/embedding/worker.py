"""One embedding worker process: one ONNX session, one request at a time.

The pool (``pool.py``) spawns N of these processes (their entry point is
``runtime/embed_worker_main.py``) and is the only peer a worker has. Why a process per worker rather than threads: a worker
that crashes (or is SIGKILLed by the pool for hanging) takes nothing else with it, and
the pool re-runs its request on a fresh one.

Worker <-> pool messages (internal, not protocol v1; encoded with the same codec and
limits). The worker's DEALER identity is ``NAME.GENERATION`` so a restarted worker never
inherits its predecessor's routing:

- worker -> pool ``{"type": "ready", "name", "pid", "dim"}`` once the model is loaded;
- pool -> worker ``{"type": "work", "rid": int, "texts": [str, ...]}``;
- worker -> pool ``{"type": "progress", "rid", "batches_done": int, "paused": bool}``
  before each micro-batch after the first, and whenever it starts waiting for
  interactive work (advisory: the pool shows it in ``status``; dropped if the pool is not
  reading);
- worker -> pool ``{"type": "result", "rid", "dim", "data": bytes, "waited_s",
  "batches", "pauses", "pauses_within"}`` (all vectors as one float32 little-endian
  blob, ``len(texts) * dim`` values; how long and how often it waited for interactive
  work, and how many of those waits came after its first micro-batch) or
  ``{"type": "failed", "rid", "message"}`` when the session raised.

Micro-batches: a request is embedded ``micro_batch`` texts per ONNX run (the session
sorts the request's texts by length and cuts them; ``models/embedding.py``), and before
each run the worker reads the device state on this thread (``PolledGate``) and waits
while interactive work is in flight. So a chat that arrives during a 32-text request
waits for one micro-batch, not for the whole request. The vectors are those of one
whole-request batch to float32 rounding: the graph masks the padding, but a run padded
to another width sums in another order, so a row may differ in its last bit or two
(docs/embeddings.md).

Exit codes: 0 on SIGTERM or when the pool went away, 3 when the model cannot be loaded
(the pool backs off before the next start).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
from loguru import logger

from uniun.models.embedding import EmbeddingSession
from uniun.protocol.codec import Limits, encode, try_decode
from uniun.protocol.device_state import PolledGate
from uniun.protocol.errors import ProtocolError

EXIT_MODEL = 3
DEFAULT_MICRO_BATCH = 4  # texts per ONNX run of one request (config embed.micro_batch)
# Pool <-> worker frames: a ``work`` message carries a whole client request (up to the
# 1 MiB client frame) plus a few bytes of its own, so it needs more room than a client.
INTERNAL_LIMITS = Limits(frame_bytes=8 << 20, max_str_len=8 << 20, max_bin_len=8 << 20)
POLL_MS = 500  # how often an idle worker checks its stop flag and its parent, ms


def serve(name: str, identity: bytes, backend: str, model_dir: Path, *, threads: int = 1,
          micro_batch: int = DEFAULT_MICRO_BATCH, parent_pid: int | None = None,
          stop: threading.Event | None = None, device_state: str = "",
          session: Any = None) -> int:
    """Load the model, say ``ready``, then answer ``work`` until told to stop.

    ``device_state``: the scheduler's device-state endpoint; while it says interactive
    work is in flight no new micro-batch starts (the request waits; its wait is reported
    in the result as ``waited_s``). ``session``: an already loaded session (tests).
    """
    stop = stop or threading.Event()
    try:
        session = session or EmbeddingSession(model_dir, threads=threads,
                                              batch_size=micro_batch)
    except Exception as exc:  # noqa: BLE001 - any load failure ends this worker the same way
        logger.error("cannot load the embedding model from {}: {}", model_dir, exc)
        return EXIT_MODEL
    ctx: zmq.Context = zmq.Context.instance()
    gate = PolledGate(device_state or None, ctx=ctx)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(backend)
    gate.wait_heard()  # start with the scheduler's current state, not a guess
    sock.send(encode({"type": "ready", "name": name, "pid": os.getpid(), "dim": session.dim},
                     INTERNAL_LIMITS))
    logger.info("ready (dim {}, {} thread(s), {} texts per micro-batch)", session.dim,
                threads, getattr(session, "batch_size", "?"))
    try:
        while not stop.is_set():
            if not sock.poll(POLL_MS):
                if parent_pid is not None and os.getppid() != parent_pid:
                    logger.warning("the pool is gone; exiting")
                    return 0
                continue
            msg = try_decode(sock.recv(), INTERNAL_LIMITS)
            if isinstance(msg, ProtocolError) or msg.get("type") != "work":
                logger.error("ignoring a malformed message from the pool: {}", msg)
                continue
            turns = _Turns(msg.get("rid"), gate, stop, lambda body: _notify(sock, body))
            sock.send(_answer(session, msg, turns))
    finally:
        gate.close()
        sock.close(linger=1000)
    return 0


def _notify(sock: zmq.Socket, body: dict[str, Any]) -> None:
    """Send an advisory message to the pool; a pool that is not reading loses it."""
    try:
        sock.send(encode(body, INTERNAL_LIMITS), zmq.NOBLOCK)
    except zmq.Again:
        pass


class _Turns:
    """Called before each micro-batch of one request: report how far the request got,
    and wait while interactive work is in flight. Counts what the result reports."""

    def __init__(self, rid: Any, gate: Any, stop: threading.Event,
                 notify: Callable[[dict[str, Any]], None]) -> None:
        self.rid, self.gate, self.stop, self.notify = rid, gate, stop, notify
        self.batches = 0  # micro-batches started
        self.pauses = 0  # times it waited for interactive work
        self.pauses_within = 0  # of those, after this request's first micro-batch
        self.waited_s = 0.0

    def __call__(self) -> None:
        if self.batches:
            self.notify({"type": "progress", "rid": self.rid, "batches_done": self.batches,
                         "paused": False})
        if self.gate.interactive:
            self.pauses += 1
            self.pauses_within += self.batches > 0
            self.notify({"type": "progress", "rid": self.rid, "batches_done": self.batches,
                         "paused": True})
            self.waited_s += self.gate.wait_turn(self.stop)
        self.batches += 1

    def report(self) -> dict[str, Any]:
        return {"waited_s": self.waited_s, "batches": self.batches, "pauses": self.pauses,
                "pauses_within": self.pauses_within}


def _answer(session: EmbeddingSession, msg: dict[str, Any],
            turns: Callable[[], None] | None = None) -> bytes:
    """Embed one ``work`` message; an exception becomes a ``failed`` reply, not a crash."""
    rid = msg.get("rid")
    texts = msg.get("texts")
    try:
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValueError("work.texts must be a list of strings")
        vectors = session.embed(texts, turns)
        report = turns.report() if isinstance(turns, _Turns) else {}
        return encode({"type": "result", "rid": rid, "dim": int(vectors.shape[1]),
                       "data": vectors.astype("<f4", copy=False).tobytes(), **report},
                      INTERNAL_LIMITS)
    except Exception as exc:  # noqa: BLE001 - reported to the pool as a value, not a crash
        logger.exception("request {} failed", rid)
        return encode({"type": "failed", "rid": rid,
                       "message": f"{type(exc).__name__}: {exc}"[:500]}, INTERNAL_LIMITS)
