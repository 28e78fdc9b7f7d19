"""A body's JSON, parsed so that every client mistake is a 400 naming it (body.py), and
the errors the gateway writes: capped, with nothing internal and nothing unencodable."""

from __future__ import annotations

import json

import pytest

from uniun.actors.gateway.body import MAX_DEPTH, carriable, parse_json
from uniun.actors.gateway.errors import ApiError, from_protocol


def refusal(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as err:
        parse_json(raw)
    assert err.value.status == 400 and err.value.code == "bad_envelope"
    json.dumps(err.value.body()).encode()  # the answer itself can be written
    return err.value


def test_valid_json_passes() -> None:
    doc = {"model": "m", "messages": [{"role": "user", "content": "héllo \U0001F600"}],
           "seed": 2**64 - 1, "n": -(2**63)}
    assert parse_json(json.dumps(doc).encode()) == doc
    assert parse_json(json.dumps(doc, ensure_ascii=False).encode()) == doc


def test_a_lone_surrogate_is_400_naming_where_it_is() -> None:
    error = refusal(b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}')
    assert "surrogate" in error.message and error.param == "messages[0].content"
    assert refusal(b'{"\\udfff": 1}').param is None
    assert parse_json(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001F600"}  # a valid pair


def test_nesting_100000_deep_is_400_not_a_recursion_error() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    assert "nested deeper" in refusal(deep).message
    assert "nested deeper" in refusal(b'{"a": ' + deep + b"}").message


def test_nesting_over_the_limit_but_parsable_is_400() -> None:
    ok = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert parse_json(ok) is not None
    over = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    assert "nested deeper" in refusal(over).message


@pytest.mark.parametrize("raw", [b'{"a": NaN}', b'{"a": Infinity}', b'{"a": -Infinity}'])
def test_non_json_constants_are_400(raw: bytes) -> None:
    assert "not JSON" in refusal(raw).message


def test_numbers_the_protocol_cannot_carry_are_400() -> None:
    assert refusal(b'{"seed": 18446744073709551616}').param == "seed"
    assert refusal(b'{"x": [-9223372036854775809]}').param == "x[0]"
    assert refusal(b'{"a": {"b": 1e999}}').param == "a.b"
    assert refusal(b'{"a": -1e999}').param == "a"
    error = refusal(b'{"a": ' + b"9" * 5000 + b"}")
    assert "digits" in error.message and "sys." not in error.message


@pytest.mark.parametrize("raw", [b"", b"{", b"{'a': 1}", b'{"a": 1,}', b"\xef\xbb\xbf{}",
                                 b'{"a": "\xff"}', b'{"a": "\xed\xa0\x80"}', b"\x00"])
def test_what_is_not_json_or_not_utf8_is_400(raw: bytes) -> None:
    refusal(raw)


def test_utf16_is_not_taken_for_json() -> None:
    refusal(json.dumps({"a": 1}).encode("utf-16"))


def test_a_job_too_big_for_a_frame_is_400() -> None:
    carriable({"job_id": "j", "prompt": "x" * 1000})
    with pytest.raises(ApiError) as err:
        carriable({"job_id": "j", "prompt": "x" * (1 << 20)})
    assert err.value.status == 400
    deep: dict = {}
    node = deep
    for _ in range(20):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(ApiError):
        carriable({"job_id": "j", "format": {"type": "json_schema", "schema": deep}})


def test_error_messages_are_capped_and_encodable() -> None:
    error = ApiError(400, "role '\ud800" + "x" * 5000 + "' is not supported")
    body = error.body()
    assert len(body["error"]["message"]) < 450  # 400 characters, escapes written out
    json.dumps(body, ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("code", ["internal", "runner_failed", "shutting_down", "bogus"])
def test_our_side_codes_say_nothing_internal(code: str) -> None:
    error = from_protocol(code, "Traceback: /home/u/.uniun/run/front.sock ValueError")
    assert "front.sock" not in error.message and "Traceback" not in error.message
    assert error.status >= 500


def test_client_side_codes_keep_their_message() -> None:
    error = from_protocol("invalid_field", "temperature must be <= 10", "sampling.temperature")
    assert error.status == 400 and error.message == "temperature must be <= 10"
    assert error.param == "temperature"
