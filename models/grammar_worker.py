"""The grammar sandbox's child: compiles one client format at a time, and may die doing it.

Run as ``python -m uniun.models.grammar_worker`` by :mod:`uniun.models.grammar_sandbox`,
never by hand. It reads requests from stdin and writes verdicts to stdout, each frame a
4-byte big-endian length and a msgpack map:

- request ``{"fmt": <format map>}`` (a job's ``format``, or the runner's ``tools`` map);
- verdict ``{"ok": true}`` or ``{"ok": false, "error": "<the engine's message>"}``.

The compile runs on a thread with a stack of :data:`STACK_BYTES`, half of the 8 MiB a
runner thread has, so whatever compiles here compiles in the runner with room to spare.
Memory is capped (``RLIMIT_AS``, :data:`MEMORY_BYTES`): a schema that blows up the
engine's memory kills this process, not the machine. EOF on stdin (the scheduler is
gone) ends it.
"""

from __future__ import annotations

import resource
import struct
import sys
import threading
from typing import Any, BinaryIO

import msgpack

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


def verdict(fmt: Any) -> dict[str, Any]:
    """Compile ``fmt`` on a thread of :data:`STACK_BYTES` and say whether it compiled."""
    from uniun.models.constrain import FormatError, check_format

    result: dict[str, Any] = {}

    def compile_it() -> None:
        try:
            check_format(fmt)
            result["ok"] = True
        except FormatError as err:
            result.update(ok=False, error=str(err))
        except Exception as err:  # noqa: BLE001 - any engine failure is the format's verdict
            result.update(ok=False, error=f"cannot be compiled: {err}")

    thread = threading.Thread(target=compile_it, name="grammar-compile")
    thread.start()
    thread.join()
    return result or {"ok": False, "error": "the compiler returned no verdict"}


def main() -> int:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    threading.stack_size(STACK_BYTES)
    verdict(WARM_UP)  # the engine loaded and run once before the first request, not in it
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    write_frame(stdout, msgpack.packb({"ready": True}))
    while (frame := read_frame(stdin)) is not None:
        request = msgpack.unpackb(frame, raw=False)
        write_frame(stdout, msgpack.packb(verdict(request.get("fmt"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
