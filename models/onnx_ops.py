"""The operator types a ``model.onnx`` uses, read without the ``onnx`` package.

Why: the runner needs one bit about its graph (does it use ``GroupQueryAttention``, so
that past and present KV may share a buffer?), and importing ``onnx`` to learn it would
keep that package resident in the runner process for as long as it lives (the runner's
peak RSS is one of the goals, docs/design.md §7). A model saved with external data keeps
only the graph in ``model.onnx`` (kilobytes), so walking its protobuf fields by hand is
quick: ``ModelProto.graph`` is field 7, ``GraphProto.node`` field 1, ``NodeProto.op_type``
field 4 (onnx.proto3). Functions and subgraphs are not walked: the decoders we load
keep their attention in the main graph.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

__all__ = ["op_types"]

_GRAPH, _NODE, _OP_TYPE = 7, 1, 4
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(data: memoryview) -> Iterator[tuple[int, memoryview | None]]:
    """(field number, payload of length-delimited fields else None) of one message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, pos = _varint(data, pos)
            yield number, None
        elif wire == _BYTES:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise ValueError("truncated field")
            yield number, data[pos:pos + size]
            pos += size
        elif wire in (_FIXED64, _FIXED32):
            pos += 8 if wire == _FIXED64 else 4
            yield number, None
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def op_types(model_path: Path | str) -> set[str]:
    """Every ``op_type`` of the main graph's nodes; ValueError if the file is not a model."""
    data = memoryview(Path(model_path).read_bytes())
    found: set[str] = set()
    for number, graph in _fields(data):
        if number != _GRAPH or graph is None:
            continue
        for field, node in _fields(graph):
            if field != _NODE or node is None:
                continue
            for key, value in _fields(node):
                if key == _OP_TYPE and value is not None:
                    found.add(bytes(value).decode("utf-8", "replace"))
    return found
