"""The envelope codec: one msgpack map per ZeroMQ frame, decoded under hard limits.

Rules of this file (docs/protocol.md, "Transport"):

- One message is one frame holding one msgpack **map** with **string** keys. Anything
  else -- not msgpack, trailing bytes, a list at the top, an int or bytes key, an ext
  type (timestamps included), a frame over the size limit, a container longer than its
  limit, nesting deeper than the limit -- is ``bad_envelope``.
- Every frame is decoded by a fresh ``msgpack.unpackb`` call: no unpacker state survives
  from one message to the next, so one hostile frame cannot poison the following ones.
- Decoding never crashes the caller. :func:`decode` raises only
  :class:`~uniun.protocol.errors.ProtocolError` (code ``bad_envelope``);
  :func:`try_decode` returns that error as a value instead.
- Encoding is for our own messages; a message we cannot encode (a non-str key, an
  unsupported type, over the frame limit) is a local bug or a local misuse and raises
  :class:`EncodeError` (a ``ValueError``), never sends a frame the peer would reject.

No I/O here and no zmq: any socket layer (actor, client, test) drives this.

Why the limits matter: msgpack length headers are attacker-controlled; without a
limit, a 5-byte frame can claim a 4 GiB array. ``unpackb`` checks each header against
the ``max_*_len`` limits *before* allocating, and the frame-size check runs before
msgpack sees a byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from uniun.protocol.errors import ErrorCode, ProtocolError

DEFAULT_FRAME_BYTES = 1 << 20  # 1 MiB: the protocol's default frame size limit, bytes


@dataclass(frozen=True)
class Limits:
    """Hard limits applied to every decoded frame. All defaults are documented here.

    ``frame_bytes``: the whole frame, bytes (default 1 MiB, docs/protocol.md).
    ``max_str_len``: one string, UTF-8 bytes (default: the frame size; a prompt may be
    most of a frame). ``max_bin_len``: one byte string, bytes (default: the frame size;
    embedding vectors are bin). ``max_array_len``: items in one list (default 65 536).
    ``max_map_len``: keys in one map (default 1 024; protocol maps have ~12 keys, status
    maps one key per flow). ``max_depth``: nesting of containers, the envelope map being
    depth 1 (default 16; the deepest v1 message, a submit with messages, has depth 4).
    """

    frame_bytes: int = DEFAULT_FRAME_BYTES
    max_str_len: int = DEFAULT_FRAME_BYTES
    max_bin_len: int = DEFAULT_FRAME_BYTES
    max_array_len: int = 65_536
    max_map_len: int = 1_024
    max_depth: int = 16


DEFAULT_LIMITS = Limits()


class EncodeError(ValueError):
    """A message of ours cannot be put on the wire (bad type, non-str key, too large)."""


def _reject_ext(code: int, data: bytes) -> Any:
    """``ext_hook``: protocol v1 has no ext types; refuse them instead of guessing."""
    raise ValueError(f"ext type {code} is not allowed")


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_ENVELOPE, message)


def _check_tree(root: dict[Any, Any], limits: Limits) -> None:
    """Walk the decoded message once: string keys only, depth within the limit.

    Iterative, so a deep frame cannot exhaust Python's recursion limit; bounded by the
    number of items, which the frame size already bounds.
    """
    stack: list[tuple[Any, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if depth > limits.max_depth:
                raise _bad(f"nesting deeper than {limits.max_depth}")
            for key, value in node.items():
                if not isinstance(key, str):
                    raise _bad(f"map key of type {type(key).__name__}; keys must be strings")
                if not _is_scalar(value):
                    stack.append((value, depth + 1))
        elif isinstance(node, list):
            if depth > limits.max_depth:
                raise _bad(f"nesting deeper than {limits.max_depth}")
            for value in node:
                if not _is_scalar(value):
                    stack.append((value, depth + 1))
        elif not _is_scalar(node):
            # msgpack.Timestamp / ExtType: ext_hook and max_ext_len=0 already stop these;
            # this is the belt to that pair of braces.
            raise _bad(f"value of type {type(node).__name__} is not allowed")


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, bytes))


def decode(frame: bytes | bytearray | memoryview,
           limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Decode one frame into a message map, or raise ``ProtocolError(bad_envelope)``.

    The returned map is plain Python data (dict, list, str, bytes, int, float, bool,
    None) with string keys at every level. It is not yet validated as a protocol
    message: that is :func:`uniun.protocol.messages.parse_request`'s job.
    """
    size = len(frame)
    if size > limits.frame_bytes:
        raise _bad(f"frame of {size} bytes is over the {limits.frame_bytes}-byte limit")
    if size == 0:
        raise _bad("empty frame")
    try:
        obj = msgpack.unpackb(
            frame, raw=False, strict_map_key=True, use_list=True, ext_hook=_reject_ext,
            max_str_len=limits.max_str_len, max_bin_len=limits.max_bin_len,
            max_array_len=limits.max_array_len, max_map_len=limits.max_map_len,
            max_ext_len=0, timestamp=0,
        )
    except msgpack.ExtraData:
        raise _bad("trailing bytes after the message map") from None
    except (ValueError, TypeError, MemoryError, RecursionError) as err:
        # ValueError covers FormatError, StackError, UnicodeDecodeError and the limit
        # checks; TypeError an unhashable key. The message text is msgpack's, kept short.
        raise _bad(f"not a valid msgpack message: {str(err)[:200] or type(err).__name__}") from None
    if not isinstance(obj, dict):
        raise _bad(f"message is a msgpack {type(obj).__name__}, not a map")
    _check_tree(obj, limits)
    return obj


def try_decode(frame: bytes | bytearray | memoryview,
               limits: Limits = DEFAULT_LIMITS) -> dict[str, Any] | ProtocolError:
    """Like :func:`decode`, but the error is returned as a value, never raised."""
    try:
        return decode(frame, limits)
    except ProtocolError as err:
        return err


def encode(msg: dict[str, Any], limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Encode one message map into one frame.

    Raises :class:`EncodeError` if ``msg`` is not a map with string keys, holds a type
    msgpack v1 cannot carry without ext types, or the frame would exceed
    ``limits.frame_bytes`` -- so a peer never receives a frame it must reject.
    """
    if not isinstance(msg, dict):
        raise EncodeError(f"a message must be a map, not {type(msg).__name__}")
    try:
        frame = msgpack.packb(msg, use_bin_type=True, strict_types=False, datetime=False)
    except (TypeError, ValueError, OverflowError) as err:
        raise EncodeError(f"cannot encode message: {err}") from None
    if len(frame) > limits.frame_bytes:
        raise EncodeError(
            f"message of {len(frame)} bytes is over the {limits.frame_bytes}-byte frame limit")
    # Our own messages obey exactly the rules we enforce on peers: check by decoding.
    # Messages are small (a token event is ~60 bytes), so the round trip is cheap.
    checked = try_decode(frame, limits)
    if isinstance(checked, ProtocolError):
        raise EncodeError(f"message would be rejected by its peer: {checked.message}")
    return frame
