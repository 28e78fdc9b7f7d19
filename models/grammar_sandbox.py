"""Compile clients' grammars in a child process, where a crash costs one request.

Why: the scheduler checks every ``format`` and tool schema at submit time, so a schema
the grammar engine cannot compile is refused with ``invalid_field`` before the job is
queued. The engine is native code; a schema that crashes it (a stack overflow is a
SIGSEGV, not an exception) would kill the scheduler and every client's work with it.
:mod:`uniun.protocol.schema_bounds` refuses the shapes known to do that; this sandbox
contains whatever it does not foresee. The check runs in a long-lived child
(``models/grammar_worker.py``: smaller stack than the runner's, capped memory), compiles
the format as the runner will for the job's model (its tokenizer, the first token mask:
an engine hang shows there, not in a grammar check), and:

- the child crashed: the request is refused (``FormatError`` naming the signal) and the
  next check starts a new child; the verdict is cached, so a re-sent request costs no
  second crash;
- the child took longer than ``timeout_s``: it is killed, the request is refused as
  "not compiled within N s" (not cached: load may have been the cause);
- a verdict per distinct format is kept (``cache_size``, least recently used out), so a
  format sent again (a client's re-send, an agent's fixed tool list) is answered at once.

Cost per request: one pipe round trip, ~0.1 ms beside the compile's few ms (``bench
--schemas`` measures a chat's TTFT with it on and off). The child is started with the
scheduler, so the engine's import is not paid by the first request.
"""

from __future__ import annotations

import hashlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgpack
from loguru import logger

from uniun.models.constrain import FormatError
from uniun.models.grammar_worker import HEADER, WARM_UP

__all__ = ["GrammarSandbox", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 2.0
START_TIMEOUT_S = 60.0  # the child imports the engine once (~0.3 s; slow disks, more)


class _Died(Exception):
    """The child ended (crashed, or killed) before answering."""


class GrammarSandbox:
    """``check(fmt)``: raise :class:`FormatError` unless ``fmt`` compiles in the child.

    Thread-safe (one check at a time); the child is (re)started on demand.
    """

    def __init__(self, *, timeout_s: float = DEFAULT_TIMEOUT_S, cache_size: int = 256,
                 model_folder: Callable[[str], Path] | None = None) -> None:
        """``model_folder``: where a model id's files are (its tokenizer); None compiles
        grammars without a model (the engine's grammar check only)."""
        self.timeout_s = timeout_s
        self.model_folder = model_folder
        self.cache_size = cache_size
        self.crashes = 0  # children lost to a format (for status and the tests)
        self.timeouts = 0
        self._verdicts: OrderedDict[bytes, str | None] = OrderedDict()  # error, None: ok
        self._child: subprocess.Popen[bytes] | None = None
        self._loaded: set[str] = set()  # model folders whose tokenizer the child holds
        self._lock = threading.Lock()

    # -- life -----------------------------------------------------------------------
    def start(self, warm_model: str | None = None) -> GrammarSandbox:
        """Start the child; with ``warm_model``, load that model's tokenizer into it now
        (~0.5 s), so the first chat with a schema does not pay for it."""
        with self._lock:
            self._ensure_child()
            if warm_model is not None:
                self._compile(WARM_UP, self._folder(warm_model))
        return self

    def start_in_background(self, warm_model: str | None = None) -> None:
        """:meth:`start` on a thread of its own: the caller (the scheduler starting up)
        does not wait the child's start and tokenizer load (~1 s); a check that comes
        meanwhile waits for it under the lock, and one after a failed start retries."""
        def run() -> None:
            try:
                self.start(warm_model)
            except FormatError as err:
                logger.warning("grammar sandbox: {}; the first check starts it again", err)

        threading.Thread(target=run, name="grammar-sandbox-start", daemon=True).start()

    def close(self) -> None:
        with self._lock:
            self._stop_child()

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    # -- checking -------------------------------------------------------------------
    def check(self, fmt: Mapping[str, Any], model_id: str | None = None) -> None:
        folder = self._folder(model_id)
        key = hashlib.sha256(msgpack.packb([fmt, folder], default=str)).digest()
        with self._lock:
            if key in self._verdicts:
                self._verdicts.move_to_end(key)
                error = self._verdicts[key]
            else:
                error, cacheable = self._compile(fmt, folder)
                if cacheable:
                    self._remember(key, error)
        if error is not None:
            raise FormatError(error)

    def _folder(self, model_id: str | None) -> str | None:
        if model_id is None or self.model_folder is None:
            return None
        try:
            return str(self.model_folder(model_id))
        except ValueError:
            return None  # not a valid model id: the job's own checks refuse it

    def _compile(self, fmt: Mapping[str, Any], folder: str | None) -> tuple[str | None, bool]:
        """(error or None, whether the verdict may be cached).

        The first format for a model in a child also loads that model's tokenizer
        (~0.5 s, more for a large vocabulary): not the format's cost, so that request
        gets :data:`START_TIMEOUT_S` on top of ``timeout_s``.
        """
        child = self._ensure_child()
        timeout_s = self.timeout_s
        if folder is not None and folder not in self._loaded:
            timeout_s += START_TIMEOUT_S
        try:
            self._send(child, msgpack.packb({"fmt": fmt, "model": folder}, default=str))
            reply = msgpack.unpackb(self._receive(child, time.monotonic() + timeout_s),
                                    raw=False)
        except TimeoutError:
            self.timeouts += 1
            self._stop_child()
            logger.warning("grammar sandbox: a format took over {:g} s to compile; child "
                           "killed", timeout_s)
            return f"could not be compiled within {timeout_s:g} s", False
        except _Died:
            self.crashes += 1
            code = self._stop_child()
            how = (f"signal {signal.Signals(-code).name}" if code is not None and code < 0
                   else f"exit status {code}")
            logger.warning("grammar sandbox: compiling a client's format killed the child "
                           "({}); the request is refused, a new child starts", how)
            return f"crashed the grammar compiler ({how}); the format is refused", True
        if folder is not None:
            self._loaded.add(folder)
        if reply.get("ok"):
            return None, True
        return str(reply.get("error") or "cannot be compiled")[:300], True

    def _remember(self, key: bytes, error: str | None) -> None:
        self._verdicts[key] = error
        while len(self._verdicts) > self.cache_size:
            self._verdicts.popitem(last=False)

    # -- the child ------------------------------------------------------------------
    def _ensure_child(self) -> subprocess.Popen[bytes]:
        if self._child is not None and self._child.poll() is None:
            return self._child
        self._stop_child()
        child = subprocess.Popen([sys.executable, "-m", "uniun.models.grammar_worker"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 close_fds=True)
        self._child = child
        loaded, self._loaded = self._loaded, set()
        try:
            ready = msgpack.unpackb(self._receive(child, time.monotonic() + START_TIMEOUT_S))
            for folder in sorted(loaded):  # a new child holds the tokenizers the last one
                self._send(child, msgpack.packb({"fmt": WARM_UP, "model": folder}))  # did
                self._receive(child, time.monotonic() + START_TIMEOUT_S)
                self._loaded.add(folder)
        except (TimeoutError, _Died):
            self._stop_child()
            raise FormatError("the grammar compiler could not be started") from None
        if not ready.get("ready"):
            self._stop_child()
            raise FormatError("the grammar compiler could not be started")
        logger.debug("grammar sandbox: child {} ready", child.pid)
        return child

    def _stop_child(self) -> int | None:
        """Kill and reap the child; its exit status (negative: the signal), if any."""
        child, self._child = self._child, None
        if child is None:
            return None
        if child.poll() is None:
            child.kill()
        code = child.wait()
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()
        return code

    @staticmethod
    def _send(child: subprocess.Popen[bytes], body: bytes) -> None:
        assert child.stdin is not None
        try:
            child.stdin.write(HEADER.pack(len(body)) + body)
            child.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _Died from None

    @staticmethod
    def _receive(child: subprocess.Popen[bytes], deadline: float) -> bytes:
        """One frame from the child by ``deadline`` (TimeoutError), or _Died at EOF."""
        assert child.stdout is not None
        fd = child.stdout.fileno()
        data = b""
        want = HEADER.size
        header_read = False
        while len(data) < want:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, want - len(data))
            if not chunk:
                child.wait()
                raise _Died
            data += chunk
            if not header_read and len(data) == HEADER.size:
                want, data, header_read = HEADER.unpack(data)[0], b"", True
        return data
