"""The grammar sandbox's child: compiles one client format at a time, and may die doing it.

Run as ``python -m uniun.models.grammar_worker`` by :mod:`uniun.models.grammar_sandbox`,
never by hand. It reads requests from stdin and writes verdicts to stdout, each frame a
4-byte big-endian length and a msgpack map:

- request ``{"fmt": <format map>, "model": <the model's folder, or nil>}`` (a job's
  ``format``, or the runner's ``tools`` map);
- verdict ``{"ok": true}`` or ``{"ok": false, "error": "<the engine's message>"}``.

With a model folder, the format is compiled as the runner will compile it: the
:class:`~uniun.models.constrain.Constraint` over that model's tokenizer, vocabulary and
EOS ids, and its first token mask computed. Checking the grammar alone is not enough:
``{"type": "number", "multipleOf": 2147483648}`` passes the engine's grammar check and
then never finishes building its matcher (memory growing without bound), which in the
runner would hang every job behind it. Here it meets the sandbox's time limit instead.

The compile runs on a thread with a stack of :data:`STACK_BYTES`, half of the 8 MiB a
runner thread has, so whatever compiles here compiles in the runner with room to spare.
Memory is capped (``RLIMIT_AS``, :data:`MEMORY_BYTES`): a schema that blows up the
engine's memory kills this process, not the machine. EOF on stdin (the scheduler is
gone) ends it.
"""

from __future__ import annotations

import functools
import json
import resource
import struct
import sys
import threading
from pathlib import Path
from typing import Any, BinaryIO

import msgpack
import numpy as np

STACK_BYTES = 4 * 1024 * 1024
MEMORY_BYTES = 2 * 1024 * 1024 * 1024
HEADER = struct.Struct(">I")
WARM_UP = {"type": "json_schema", "schema": {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20}, "n": {"type": "integer"}}}}


def read_frame(stream: BinaryIO) -> bytes | None:
    """One length-prefixed frame, or None at EOF."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    body = stream.read(HEADER.unpack(head)[0])
    return body if len(body) == HEADER.unpack(head)[0] else None


def write_frame(stream: BinaryIO, body: bytes) -> None:
    stream.write(HEADER.pack(len(body)) + body)
    stream.flush()


@functools.lru_cache(maxsize=4)
def _model(folder: str) -> tuple[Any, int, tuple[int, ...]]:
    """(tokenizer, vocabulary size, EOS ids) of a model folder, as the runner reads them."""
    from uniun.models.decoder_model import eos_ids_of
    from uniun.models.tokenizer import load_tokenizer

    path = Path(folder)
    tokenizer = load_tokenizer(path)
    config = json.loads((path / "config.json").read_text())
    vocab = int(config.get("vocab_size", 0)) or len(tokenizer)
    return tokenizer, vocab, eos_ids_of(path, config, tokenizer)


def _compile_for(fmt: Any, folder: str | None) -> None:
    """Raise unless ``fmt`` compiles (for the model in ``folder``: matcher and first mask)."""
    from uniun.models.constrain import Constraint, check_format

    if folder is None or not Path(folder, "tokenizer.json").is_file():
        check_format(fmt)  # no model to compile for (the runner will refuse the job itself)
        return
    tokenizer, vocab, eos_ids = _model(folder)  # the matcher checks the grammar as it builds
    Constraint(fmt, tokenizer, eos_ids, []).mask(np.zeros(vocab, dtype=np.float32))


def verdict(fmt: Any, folder: str | None = None) -> dict[str, Any]:
    """Compile ``fmt`` and say whether it compiled (the engine's failure is the verdict)."""
    from uniun.models.constrain import ConstraintError, FormatError

    try:
        _compile_for(fmt, folder)
    except (FormatError, ConstraintError) as err:
        return {"ok": False, "error": str(err)}
    except Exception as err:  # noqa: BLE001 - any engine failure is the format's verdict
        return {"ok": False, "error": f"cannot be compiled: {err}"}
    return {"ok": True}


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Answer requests until EOF; runs on the thread of :data:`STACK_BYTES`."""
    verdict(WARM_UP)  # the engine loaded and run once before the first request, not in it
    write_frame(stdout, msgpack.packb({"ready": True}))
    while (frame := read_frame(stdin)) is not None:
        request = msgpack.unpackb(frame, raw=False)
        write_frame(stdout, msgpack.packb(verdict(request.get("fmt"), request.get("model"))))


def main() -> int:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    threading.stack_size(STACK_BYTES)
    worker = threading.Thread(target=serve, args=(sys.stdin.buffer, sys.stdout.buffer),
                              name="grammar-compile")
    worker.start()  # every compile on this one thread, with the smaller stack
    worker.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
