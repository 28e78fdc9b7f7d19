"""The door's rules as pure functions of the method and headers (actors/gateway/door.py):
which Host, Origin, Content-Type and Content-Length get in, and what each refusal is."""

from __future__ import annotations

import json

import pytest

from uniun.actors.gateway.door import (
    DoorPolicy,
    check_request,
    content_type_refusal,
    error_bytes,
    host_refusal,
    length_refusal,
    origin_refusal,
    split_host,
)

POLICY = DoorPolicy.make("127.0.0.1")


def h(*pairs: tuple[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode(), v.encode("latin-1")) for k, v in pairs]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8765", "localhost", "localhost:1",
                                  "LOCALHOST:8765", "[::1]", "[::1]:8765"])
def test_loopback_names_with_or_without_a_port_get_in(host: str) -> None:
    assert host_refusal(h(("Host", host)), POLICY) is None


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8765", "127.0.0.1.evil.example",
                                  "localhost.evil.example:8765", "0.0.0.0:8765", "[::2]:8765",
                                  "127.0.0.2:8765", "localhost.", "", "127.0.0.1:80@evil",
                                  "[::1", "[::1]x", "local host", "127.0.0.1:8765:1"])
def test_any_other_host_is_421_before_anything_else(host: str) -> None:
    error = check_request("POST", h(("Host", host), ("Content-Type", "text/plain"),
                                    ("Content-Length", str(1 << 30))), POLICY)
    assert error is not None and error.status == 421 and error.code == "invalid_host"


def test_host_must_appear_exactly_once() -> None:
    assert host_refusal([], POLICY).status == 400  # type: ignore[union-attr]
    two = h(("Host", "127.0.0.1"), ("Host", "evil.example"))
    assert host_refusal(two, POLICY).status == 400  # type: ignore[union-attr]


def test_the_bind_address_and_configured_names_get_in() -> None:
    policy = DoorPolicy.make("192.168.1.5", ["uniun.lan", "[FE80::1]", "  "])
    for host in ("192.168.1.5:8765", "uniun.lan", "UNIUN.LAN:8765", "[fe80::1]:1"):
        assert host_refusal(h(("Host", host)), policy) is None, host
    assert host_refusal(h(("Host", "other.lan")), policy).status == 421  # type: ignore[union-attr]
    v6 = DoorPolicy.make("::1")
    assert "[::1]" in v6.hosts


def test_a_wildcard_bind_address_is_not_a_name() -> None:
    for bind in ("0.0.0.0", "::"):
        policy = DoorPolicy.make(bind)
        assert host_refusal(h(("Host", "0.0.0.0:8765")), policy) is not None
        assert host_refusal(h(("Host", "[::]:8765")), policy) is not None


def test_star_turns_the_host_rule_off_but_not_the_others() -> None:
    policy = DoorPolicy.make("0.0.0.0", ["*"])
    assert host_refusal(h(("Host", "anything.example:1")), policy) is None
    error = check_request("POST", h(("Host", "x.example"), ("Origin", "http://evil.example")),
                          policy)
    assert error is not None and error.status == 403


def test_split_host() -> None:
    assert split_host("LocalHost:8765") == ("localhost", "8765")
    assert split_host("[::1]:80") == ("[::1]", "80")
    assert split_host("[::1]") == ("[::1]", "")
    assert split_host("[zz::1]") is None
    assert split_host("a b") is None
    assert split_host(":80") is None


@pytest.mark.parametrize("origin", ["http://127.0.0.1:8765", "https://127.0.0.1:8765",
                                    "HTTP://127.0.0.1:8765"])
def test_same_origin_gets_in(origin: str) -> None:
    assert origin_refusal(h(("Host", "127.0.0.1:8765"), ("Origin", origin))) is None


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1:1",
                                    "http://localhost:8765", "http://127.0.0.1:8765/",
                                    "file://", ""])
def test_a_foreign_origin_is_403(origin: str) -> None:
    error = origin_refusal(h(("Host", "127.0.0.1:8765"), ("Origin", origin)))
    assert error is not None and error.status == 403 and error.code == "invalid_origin"


def test_no_origin_gets_in_unless_fetch_metadata_says_another_site_sent_it() -> None:
    assert origin_refusal(h(("Host", "127.0.0.1:8765"))) is None  # curl, the SDKs
    for site, refused in (("cross-site", True), ("same-site", True), ("same-origin", False),
                          ("none", False)):
        error = origin_refusal(h(("Host", "127.0.0.1:8765"), ("Sec-Fetch-Site", site)))
        assert (error is not None) == refused, site


def test_two_origins_are_foreign() -> None:
    two = h(("Host", "127.0.0.1:8765"), ("Origin", "http://127.0.0.1:8765"),
            ("Origin", "http://127.0.0.1:8765"))
    assert origin_refusal(two) is not None


@pytest.mark.parametrize("ctype", ["application/json", "application/json; charset=utf-8",
                                   "Application/JSON;charset=UTF-8",
                                   'application/json; charset="utf-8"'])
def test_json_bodies_get_in(ctype: str) -> None:
    assert content_type_refusal("POST", h(("Content-Type", ctype))) is None


@pytest.mark.parametrize("ctype", ["text/plain", "text/plain; charset=utf-8",
                                   "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", "application/jsonx",
                                   "application/json; charset=latin-1", "json", ""])
def test_anything_else_is_415(ctype: str) -> None:
    error = content_type_refusal("POST", h(("Content-Type", ctype)))
    assert error is not None and error.status == 415


def test_a_post_without_a_content_type_is_415_and_a_get_needs_none() -> None:
    assert content_type_refusal("POST", []).status == 415  # type: ignore[union-attr]
    assert content_type_refusal("PUT", h(("Content-Type", "text/plain"))) is not None
    assert content_type_refusal("GET", []) is None
    assert content_type_refusal("GET", h(("Content-Type", "text/plain"))) is None


def test_a_declared_length_over_the_limit_is_413() -> None:
    assert length_refusal(h(("Content-Length", str(1 << 20))), 1 << 20) is None
    error = length_refusal(h(("Content-Length", str(256 << 20))), 1 << 20)
    assert error is not None and error.status == 413
    assert length_refusal(h(("Content-Length", "1")), 0) is not None
    assert length_refusal([], 0) is None  # chunked: the reader cuts it off


def test_rules_apply_in_order() -> None:
    everything_wrong = h(("Host", "evil.example"), ("Origin", "http://evil.example"),
                         ("Content-Type", "text/plain"), ("Content-Length", str(1 << 30)))
    assert check_request("POST", everything_wrong, POLICY).status == 421  # type: ignore[union-attr]
    assert check_request("POST", everything_wrong[1:] + h(("Host", "localhost")),
                         POLICY).status == 403  # type: ignore[union-attr]
    assert check_request("POST", h(("Host", "localhost"), ("Content-Type", "text/plain"),
                                   ("Content-Length", str(1 << 30))),
                         POLICY).status == 415  # type: ignore[union-attr]
    assert check_request("POST", h(("Host", "localhost"), ("Content-Type", "application/json"),
                                   ("Content-Length", str(1 << 30))),
                         POLICY).status == 413  # type: ignore[union-attr]
    assert check_request("POST", h(("Host", "localhost"), ("Content-Type", "application/json"),
                                   ("Content-Length", "2")), POLICY) is None


def test_refusals_are_openai_error_objects_in_ascii() -> None:
    error = check_request("GET", h(("Host", "evil.example")), POLICY)
    assert error is not None
    body = error_bytes(error)
    assert body.isascii()
    doc = json.loads(body)
    assert set(doc["error"]) == {"message", "type", "param", "code"}
    assert doc["error"]["type"] == "invalid_request_error"
