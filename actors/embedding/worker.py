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
- worker -> pool ``{"type": "result", "rid", "dim", "data": bytes}`` (all vectors as one
  float32 little-endian blob, ``len(texts) * dim`` values) or
  ``{"type": "failed", "rid", "message"}`` when the session raised.

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
from uniun.protocol.device_state import YieldGate
from uniun.protocol.errors import ProtocolError

EXIT_MODEL = 3
# Pool <-> worker frames: a ``work`` message carries a whole client request (up to the
# 1 MiB client frame) plus a few bytes of its own, so it needs more room than a client.
INTERNAL_LIMITS = Limits(frame_bytes=8 << 20, max_str_len=8 << 20, max_bin_len=8 << 20)
POLL_MS = 500  # how often an idle worker checks its stop flag and its parent, ms


def serve(name: str, identity: bytes, backend: str, model_dir: Path, *, threads: int = 1,
          parent_pid: int | None = None, stop: threading.Event | None = None,
          device_state: str = "", session: Any = None) -> int:
    """Load the model, say ``ready``, then answer ``work`` until told to stop.

    ``device_state``: the scheduler's device-state endpoint; while it says interactive
    work is in flight no new batch starts (the request waits; its wait is reported in
    the result as ``waited_s``). ``session``: an already loaded session (tests).
    """
    stop = stop or threading.Event()
    gate = YieldGate(device_state or None)
    try:
        session = session or EmbeddingSession(model_dir, threads=threads)
    except Exception as exc:  # noqa: BLE001 - any load failure ends this worker the same way
        logger.error("cannot load the embedding model from {}: {}", model_dir, exc)
        return EXIT_MODEL
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(backend)
    gate.wait_heard()  # start with the scheduler's current state, not a guess
    sock.send(encode({"type": "ready", "name": name, "pid": os.getpid(), "dim": session.dim},
                     INTERNAL_LIMITS))
    logger.info("ready (dim {}, {} thread(s))", session.dim, threads)
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
            sock.send(_answer(session, msg, lambda: gate.wait_turn(stop)))
    finally:
        gate.close()
        sock.close(linger=1000)
    return 0


def _answer(session: EmbeddingSession, msg: dict[str, Any],
            wait_turn: Callable[[], float] = lambda: 0.0) -> bytes:
    """Embed one ``work`` message; an exception becomes a ``failed`` reply, not a crash."""
    rid = msg.get("rid")
    texts = msg.get("texts")
    waited = [0.0]

    def before_batch() -> None:
        waited[0] += wait_turn()

    try:
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValueError("work.texts must be a list of strings")
        vectors = session.embed(texts, before_batch)
        return encode({"type": "result", "rid": rid, "dim": int(vectors.shape[1]),
                       "data": vectors.astype("<f4", copy=False).tobytes(),
                       "waited_s": waited[0]}, INTERNAL_LIMITS)
    except Exception as exc:  # noqa: BLE001 - reported to the pool as a value, not a crash
        logger.exception("request {} failed", rid)
        return encode({"type": "failed", "rid": rid,
                       "message": f"{type(exc).__name__}: {exc}"[:500]}, INTERNAL_LIMITS)
