"""The envelope codec: every malformed frame is a bad_envelope value, never a crash."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from uniun.protocol.codec import DEFAULT_LIMITS, EncodeError, Limits, decode, encode, try_decode
from uniun.protocol.errors import ErrorCode, ProtocolError


def _bad(frame: bytes, limits: Limits = DEFAULT_LIMITS) -> ProtocolError:
    result = try_decode(frame, limits)
    assert isinstance(result, ProtocolError), f"accepted {frame[:40]!r}"
    assert result.code is ErrorCode.BAD_ENVELOPE
    with pytest.raises(ProtocolError) as info:
        decode(frame, limits)
    assert info.value.code is ErrorCode.BAD_ENVELOPE
    return result


def test_round_trip_of_a_typical_message() -> None:
    msg = {"v": 1, "type": "submit", "id": "a1",
           "job": {"job_id": "j", "kind": "chat", "deadline": None, "stream": True,
                   "messages": [{"role": "user", "content": "héllo ✓"}],
                   "sampling": {"temperature": 0.5, "seed": 2**62}}}
    assert decode(encode(msg)) == msg
    assert decode(encode({"v": 1, "type": "embeddings", "vectors": [b"\x00\x01"]}))[
        "vectors"] == [b"\x00\x01"]


def test_oversize_frame_is_rejected_before_decoding() -> None:
    frame = msgpack.packb({"v": 1, "type": "submit", "pad": "x" * (1 << 20)})
    err = _bad(frame)
    assert "limit" in err.message
    small = Limits(frame_bytes=64)
    _bad(msgpack.packb({"pad": "y" * 100}), small)


def test_deep_nesting_is_rejected() -> None:
    nested: Any = "leaf"
    for _ in range(40):
        nested = {"n": nested}
    assert "nesting" in _bad(msgpack.packb(nested)).message
    _bad(b"\x81\xa1a" + b"\x91" * 5000 + b"\xc0")  # beyond msgpack's own stack too
    ok: Any = 1
    for _ in range(DEFAULT_LIMITS.max_depth - 1):
        ok = [ok]
    assert decode(msgpack.packb({"x": ok}))


def test_huge_containers_and_strings_are_rejected_without_allocating() -> None:
    _bad(msgpack.packb({str(i): i for i in range(DEFAULT_LIMITS.max_map_len + 1)}))
    _bad(msgpack.packb({"a": list(range(DEFAULT_LIMITS.max_array_len + 1))}))
    # A 6-byte frame claiming a 4-billion-item array / map, and a 4 GiB string.
    _bad(b"\x81\xa1a\xdd\xff\xff\xff\xff")
    _bad(b"\xdf\xff\xff\xff\xff")
    _bad(b"\x81\xa1a\xdb\xff\xff\xff\xff")
    limits = Limits(max_str_len=10)
    _bad(msgpack.packb({"a": "x" * 11}), limits)


@pytest.mark.parametrize("obj", [[1, 2], "text", 7, None, True, 1.5, b"bytes"])
def test_a_top_level_value_that_is_not_a_map_is_rejected(obj: Any) -> None:
    assert "not a map" in _bad(msgpack.packb(obj, use_bin_type=True)).message


@pytest.mark.parametrize("obj", [{1: "int key"}, {b"k": 1}, {"ok": {2.5: "float key"}},
                                 {"ok": [{None: 1}]}, {(1, 2): 3}])
def test_non_string_keys_are_rejected_at_any_depth(obj: Any) -> None:
    _bad(msgpack.packb(obj, use_bin_type=True))


def test_ext_types_and_timestamps_are_rejected() -> None:
    _bad(msgpack.packb({"x": msgpack.ExtType(5, b"abc")}))
    _bad(msgpack.packb({"x": msgpack.Timestamp(1, 0)}))
    _bad(b"\x81\xa1x\xc7\x00\x05")  # a zero-length ext


@pytest.mark.parametrize("frame", [b"", b"\xc1", b"\xff\xfe\xfd", b"\x82\xa1a",
                                   b"\x81\xa2\xff\xfe\x01", b"\x80\x00", b"not msgpack at all"])
def test_garbage_bytes_are_bad_envelope(frame: bytes) -> None:
    _bad(frame)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_any_bytes_decode_to_a_map_or_a_bad_envelope_value(frame: bytes) -> None:
    result = try_decode(frame)
    assert isinstance(result, (dict, ProtocolError))
    if isinstance(result, ProtocolError):
        assert result.code is ErrorCode.BAD_ENVELOPE


def test_each_decode_is_independent_of_the_previous_bad_frame() -> None:
    good = encode({"v": 1, "type": "ping", "id": "p"})
    for bad in (b"\x82\xa1a", good[:-1], b"\xdd\xff\xff\xff\xff"):
        _bad(bad)
        assert decode(good) == {"v": 1, "type": "ping", "id": "p"}


def test_encode_refuses_what_a_peer_would_reject() -> None:
    with pytest.raises(EncodeError, match="frame limit"):
        encode({"pad": "x" * (1 << 20)})
    with pytest.raises(EncodeError):
        encode({1: "int key"})  # type: ignore[dict-item]
    with pytest.raises(EncodeError):
        encode({"x": object()})
    with pytest.raises(EncodeError):
        encode([1, 2])  # type: ignore[arg-type]
    with pytest.raises(EncodeError):
        encode({"x": msgpack.ExtType(1, b"")})
    assert decode(encode({"t": (1, 2)})) == {"t": [1, 2]}
