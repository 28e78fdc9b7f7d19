"""Hypothesis strategies for hostile HTTP requests to the gateway: every route, every layer.

Why layered rather than random bytes: random bytes never get past the request line, so
the door's header rules, the JSON parser, the field mapping and the scheduler behind
them would go untested. A drawn request is valid in every layer but one or two, which
are hostile: the request line (wrong methods, odd targets), the headers (a foreign
``Host`` or ``Origin``, a content type that is not JSON, bytes that are not a header,
lying lengths, chunked bodies), the body's JSON (not JSON, deep nesting, lone
surrogates, numbers no protocol can carry, NaN, non-UTF-8 bytes, over the size limit) or
one field of an OpenAI request (wrong type, out of range, unsupported).

Valid requests run real jobs, so they are kept tiny: at most 4 new tokens, and a
hostile value for ``max_tokens`` is never a valid count above 4. Model ids are the
runtime's own or names no one can build or download (a fuzz run writes nothing into
the model store).

A :class:`HttpDraft` says whether the gateway's door must refuse it (``door_refuses``:
a foreign ``Host`` or ``Origin``, a body that is not ``application/json``): a 2xx
answer to one of those is a hole in the door, not just a missing check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from uniun.runtime.chaos.fuzz_frames import HOSTILE_MODEL_IDS

__all__ = ["HttpDraft", "Raw", "Target", "dump", "http_drafts"]

MAX_NEW = 4  # new tokens of a valid request
JOB_IDS = tuple(f"fz-http-{i}" for i in range(4))  # shared: idempotent resubmits happen


@dataclass(frozen=True)
class Target:
    """The gateway under test and what a valid request names."""

    host: str
    port: int
    chat_model: str
    embed_model: str
    api_key: str = ""
    max_body_bytes: int = 1 << 20


@dataclass(frozen=True)
class HttpDraft:
    """One request as bytes: ``method target HTTP/1.1``, ``headers``, ``body``."""

    label: str
    method: bytes
    target: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes = b""
    door_refuses: bool = False  # a 2xx answer is a violation

    def raw(self) -> bytes:
        lines = [self.method + b" " + self.target + b" HTTP/1.1"]
        lines += [name + b": " + value for name, value in self.headers]
        return b"\r\n".join(lines) + b"\r\n\r\n" + self.body

    @property
    def is_head(self) -> bool:
        return self.method == b"HEAD"


@dataclass(frozen=True)
class Raw:
    """JSON text spliced into a body as it is (what ``json.dumps`` will not write)."""

    text: str


def dump(value: Any) -> str:
    """JSON text of ``value``, :class:`Raw` parts verbatim; lone surrogates as escapes."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value)  # str (ensure_ascii), int, float (NaN, Infinity), bool, None


# ---- values -------------------------------------------------------------------------

def _nest(depth: int, kind: str) -> Raw:
    if kind == "list":
        return Raw("[" * depth + "]" * depth)
    return Raw('{"a":' * depth + "1" + "}" * depth)


_TEXT = st.text(max_size=40)
_DEEP = st.builds(_nest, st.integers(17, 3000), st.sampled_from(("list", "map")))
_WEIRD_NUMBERS = st.sampled_from((
    Raw("9" * 5000), Raw("-" + "9" * 400), Raw("1e999"), Raw("-1e999"), Raw("-0"),
    Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1.5e-400"), Raw("0x10"),
    2**63, 2**64, 2**64 + 1, -(2**63) - 1, 10**30, -(10**30), 1e308, -1e308))
_WEIRD_STRINGS = st.sampled_from((
    "\ud800", "a\udfffb", "\udc00\ud800", "\x00", "\x00" * 64, "\U0001F600" * 20,
    "x" * 5000, "\u202e\u2066", "../../etc/passwd", "%00", "{{template}}", "\r\n\r\n"))
_SMALL = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10, 10), _TEXT),
                      lambda kids: st.one_of(st.lists(kids, max_size=3),
                                             st.dictionaries(_TEXT, kids, max_size=3)),
                      max_leaves=6)
HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), _TEXT, _WEIRD_NUMBERS, _WEIRD_STRINGS,
    st.lists(_SMALL, max_size=3), st.dictionaries(_TEXT, _SMALL, max_size=3), _DEEP)
# max_tokens and friends: hostile, never a valid count that would run a long job.
_HOSTILE_COUNT = HOSTILE.filter(lambda v: not (isinstance(v, int) and not isinstance(v, bool)
                                               and MAX_NEW < v < 2**63))
_HOSTILE_MODEL = st.one_of(st.sampled_from(HOSTILE_MODEL_IDS), HOSTILE.filter(
    lambda v: not isinstance(v, str)), _WEIRD_STRINGS)


# ---- bodies -------------------------------------------------------------------------

def _set(body: dict[str, Any], path: str, value: Any) -> None:
    """Set ``a.b`` or ``messages.0.content`` in ``body``, creating maps on the way."""
    keys = path.split(".")
    node: Any = body
    for key in keys[:-1]:
        if isinstance(node, list):
            node = node[int(key)]
            continue
        if not isinstance(node.get(key), (dict, list)):
            node[key] = {}
        node = node[key]
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


CHAT_FIELDS = (
    "model", "messages", "messages.0", "messages.0.role", "messages.0.content",
    "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "stream",
    "stream_options", "stream_options.include_usage", "n", "response_format",
    "response_format.type", "response_format.json_schema",
    "response_format.json_schema.schema", "tools", "functions", "logprobs", "logit_bias",
    "modalities", "audio", "user", "metadata", "uniun", "uniun.kind", "uniun.flow",
    "uniun.deadline", "uniun.deadline_in_s", "uniun.job_id", "uniun.foreground_hint",
    "uniun.top_k", "uniun.dead_line", "presence_penalty", "extra_field")
COMPLETION_FIELDS = ("model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop",
                     "stream", "echo", "suffix", "best_of", "logprobs", "uniun",
                     "uniun.kind", "uniun.job_id", "uniun.deadline_in_s")
EMBED_FIELDS = ("model", "input", "input.0", "encoding_format", "dimensions", "user")
COUNT_FIELDS = frozenset({"max_tokens", "max_completion_tokens"})


@st.composite
def _chat_body(draw: st.DrawFn, t: Target) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": t.chat_model, "max_tokens": draw(st.integers(1, MAX_NEW)),
        "messages": draw(st.lists(st.fixed_dictionaries(
            {"role": st.sampled_from(("system", "developer", "user", "assistant")),
             "content": st.one_of(_TEXT, st.lists(st.fixed_dictionaries(
                 {"type": st.just("text"), "text": _TEXT}), max_size=2))}),
            min_size=1, max_size=3))}
    body["messages"][-1]["role"] = "user"
    optional = draw(st.fixed_dictionaries({}, optional={
        "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "seed": st.integers(0, 99),
        "stream": st.booleans(), "stop": st.lists(st.text(min_size=1, max_size=4), max_size=2),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "response_format": st.sampled_from(({"type": "text"}, {"type": "json_object"})),
        "uniun": st.fixed_dictionaries({}, optional={
            "kind": st.sampled_from(("chat", "nataraj", "extract")),
            "flow": st.sampled_from(("a", "b")), "deadline_in_s": st.integers(0, 60),
            "job_id": st.sampled_from(JOB_IDS), "top_k": st.integers(0, 40)})}))
    body.update(optional)
    return body


@st.composite
def _completion_body(draw: st.DrawFn, t: Target) -> dict[str, Any]:
    body: dict[str, Any] = {"model": t.chat_model, "max_tokens": draw(st.integers(1, MAX_NEW)),
                            "prompt": draw(st.text(min_size=1, max_size=40))}
    body.update(draw(st.fixed_dictionaries({}, optional={
        "temperature": st.floats(0, 2), "seed": st.integers(0, 99), "stream": st.booleans()})))
    return body


@st.composite
def _embed_body(draw: st.DrawFn, t: Target) -> dict[str, Any]:
    texts = draw(st.lists(st.text(max_size=30), min_size=1, max_size=3))
    body: dict[str, Any] = {"model": t.embed_model,
                            "input": texts[0] if draw(st.booleans()) else texts}
    if draw(st.booleans()):
        body["encoding_format"] = draw(st.sampled_from(("float", "base64")))
    return body


POST_ROUTES = {"/v1/chat/completions": (_chat_body, CHAT_FIELDS),
               "/v1/completions": (_completion_body, COMPLETION_FIELDS),
               "/v1/embeddings": (_embed_body, EMBED_FIELDS)}


@st.composite
def _mutated(draw: st.DrawFn, t: Target, path: str) -> tuple[dict[str, Any], str]:
    make, fields = POST_ROUTES[path]
    body = draw(make(t))
    names = draw(st.lists(st.sampled_from(fields), min_size=1, max_size=2, unique=True))
    for name in names:
        top = name.split(".")[0]
        value = draw(_HOSTILE_MODEL if top == "model" else
                     _HOSTILE_COUNT if name in COUNT_FIELDS else HOSTILE)
        try:
            _set(body, name, value)
        except (IndexError, ValueError, TypeError, AttributeError):
            body[top] = value  # the path's parent was not there: the top key is hostile
    return body, "field:" + "+".join(names)


_RAW_BODIES = st.sampled_from((
    b"", b" ", b"{", b"{not json", b'{"model": ', b"null", b"[]", b"42", b'"text"',
    b"\xef\xbb\xbf{}", b'{"model": "\xff\xfe"}', b'{"a": "\xed\xa0\x80"}',
    b'{"a": 1,}', b"{'a': 1}", b'{"a": 1} trailing', b"\x00" * 16,
    b'{"model": "m", "model": "n"}', b"[" * 100_000 + b"]" * 100_000,
    b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"))


@st.composite
def _json_body(draw: st.DrawFn, t: Target, path: str) -> tuple[bytes, str]:
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return draw(_RAW_BODIES), "json:raw"
    if choice == 1:  # a whole value where the object should be
        return dump(draw(HOSTILE)).encode(), "json:not-an-object"
    if choice == 2:  # over the body limit, or just under it
        make, _ = POST_ROUTES[path]
        body = draw(make(t))
        size = draw(st.sampled_from((t.max_body_bytes - 200, t.max_body_bytes + 1,
                                     2 * t.max_body_bytes)))
        body["user"] = "x" * max(size, 0)
        return dump(body).encode()[: max(size, 0) + 400], "json:size"
    make, _ = POST_ROUTES[path]
    body = draw(make(t))
    body[draw(st.sampled_from(("messages", "input", "prompt", "uniun", "metadata")))] = \
        draw(st.one_of(_DEEP, _WEIRD_STRINGS, _WEIRD_NUMBERS))
    return dump(body).encode(), "json:deep-or-weird"


# ---- headers ------------------------------------------------------------------------

FOREIGN_HOSTS = (b"evil.example", b"evil.example:%d", b"127.0.0.1.evil.example:%d",
                 b"localhost.evil.example", b"0.0.0.0:%d", b"[::2]:%d", b"evil.example:80",
                 b"LOCALHOST:%d@evil.example", b"", b"127.0.0.1:%d, evil.example")
LOOPBACK_HOSTS = (b"127.0.0.1:%d", b"localhost:%d", b"localhost", b"127.0.0.1",
                  b"LocalHost:%d", b"[::1]:%d")
FOREIGN_ORIGINS = (b"http://evil.example", b"null", b"http://127.0.0.1:1", b"http://localhost.evil.example:%d",
                   b"file://", b"http://evil.example:%d")
NOT_JSON_TYPES = (b"text/plain", b"text/plain; charset=utf-8",
                  b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=x",
                  b"application/jsonx", b"application/json; charset=latin-1", b"json",
                  b"application/xml", b"*/*", b"")
JSON_TYPES = (b"application/json", b"application/json; charset=utf-8",
              b"Application/JSON", b"application/json;charset=UTF-8")
_HEADER_BYTES = st.binary(min_size=0, max_size=30)
_HEADER_NAME = st.one_of(st.sampled_from((b"X-Any", b"Accept", b"Authorization", b"Cookie",
                                          b"Expect", b"Upgrade", b"Connection")),
                         st.binary(min_size=1, max_size=12))


def _fill(pattern: bytes, port: int) -> bytes:
    return pattern % port if b"%d" in pattern else pattern


@st.composite
def _headers(draw: st.DrawFn, t: Target, *, body: bytes, post: bool
             ) -> tuple[list[tuple[bytes, bytes]], bytes, str, bool]:
    """(headers, body as sent, label suffix, door_refuses) for a request that is hostile
    in its headers, or plain valid headers when ``hostile`` is not drawn."""
    host = _fill(draw(st.sampled_from(LOOPBACK_HOSTS)), t.port)
    headers: list[tuple[bytes, bytes]] = [(b"Host", host)]
    ctype: bytes | None = draw(st.sampled_from(JSON_TYPES)) if post else None
    refuses = False
    if t.api_key:
        headers.append((b"Authorization", b"Bearer " + t.api_key.encode()))
    trick = draw(st.sampled_from(("none", "none", "host", "origin", "same-origin", "ctype",
                                  "no-ctype", "sec-fetch", "junk", "chunked", "te+cl",
                                  "length", "long", "dup-host", "no-host")))
    chunked = False
    if trick == "host":
        headers[0] = (b"Host", _fill(draw(st.sampled_from(FOREIGN_HOSTS)), t.port))
        refuses = True
    elif trick == "origin":
        headers.append((b"Origin", _fill(draw(st.sampled_from(FOREIGN_ORIGINS)), t.port)))
        refuses = True
    elif trick == "same-origin":  # the gateway's own page (https: behind a TLS proxy)
        headers.append((b"Origin", draw(st.sampled_from((b"http://", b"https://"))) + host))
    elif trick == "ctype" and post:
        ctype = draw(st.sampled_from(NOT_JSON_TYPES))
        refuses = True
    elif trick == "no-ctype" and post:
        ctype = None
        refuses = True
    elif trick == "sec-fetch":
        site = draw(st.sampled_from((b"cross-site", b"same-site", b"same-origin", b"none")))
        headers.append((b"Sec-Fetch-Site", site))
        refuses = site in (b"cross-site", b"same-site")
    elif trick == "junk":
        for _ in range(draw(st.integers(1, 3))):
            headers.append((draw(_HEADER_NAME), draw(_HEADER_BYTES)))
    elif trick == "chunked":
        chunked = True
    elif trick == "te+cl":  # both framings (request smuggling): the body chunked, whole
        headers.append((b"Transfer-Encoding", b"chunked"))
        headers.append((b"Content-Length", str(len(body)).encode()))
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    elif trick == "long":
        headers.append((b"X-Long", b"a" * draw(st.sampled_from((4000, 17000, 70000)))))
    elif trick == "dup-host":
        headers.append((b"Host", _fill(draw(st.sampled_from(FOREIGN_HOSTS + LOOPBACK_HOSTS)),
                                       t.port)))
        refuses = True
    elif trick == "no-host":
        headers.pop(0)
        refuses = True
    if ctype is not None:
        headers.append((b"Content-Type", ctype))
    if chunked:
        headers.append((b"Transfer-Encoding", b"chunked"))
        cut = draw(st.integers(1, 4096))
        parts = [body[i:i + cut] for i in range(0, len(body), cut)]
        body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    elif trick == "length":  # never more than is sent, unless refused for its size
        lie = draw(st.sampled_from((b"-1", b"abc", b"1e3", b" 5", b"0x10", b"99999999999999999999",
                                    b"268435456", str(max(len(body) - 1, 0)).encode())))
        headers.append((b"Content-Length", lie))
    elif (post or body) and trick != "te+cl":
        headers.append((b"Content-Length", str(len(body)).encode()))
    headers.append((b"Connection", b"close"))
    return headers, body, trick, refuses


# ---- requests -----------------------------------------------------------------------

GET_ROUTES = ("/v1/models", "/health", "/metrics", "/v1/models/{chat}", "/v1/models/{embed}")
WRONG_METHODS = (b"GET", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"HEAD", b"TRACE", b"POST",
                 b"post", b"FOO", b"G\xc3\x89T", b"GET\x00", b"")
ODD_TARGETS = (b"/", b"/v1", b"/v1/", b"/v1/chat/completions/", b"//v1/models",
               b"/v1/../v1/models", b"/v1/%2e%2e/health", b"/v1/models/%ff%fe",
               b"/v1/models/%00", b"/v1/models/" + b"a" * 8000, b"/health?x=" + b"%" * 100,
               b"http://evil.example/v1/models", b"*", b"v1/models", b"/\xff",
               b"/v1/models/../../../etc/passwd", b"/metrics/../health", b"/docs",
               b"/openapi.json", b"/v1/models?%zz", b"/ health")


@st.composite
def http_drafts(draw: st.DrawFn, t: Target) -> HttpDraft:
    """One hostile request; see the module docstring."""
    layer = draw(st.sampled_from(("field", "field", "field", "valid", "json", "json",
                                  "headers", "headers", "method", "target", "get")))
    if layer in ("get", "target") or (layer == "method" and draw(st.booleans())):
        path = draw(st.sampled_from(GET_ROUTES)).format(chat=t.chat_model, embed=t.embed_model)
        method = b"GET" if layer != "method" else draw(st.sampled_from(WRONG_METHODS))
        target = path.encode() if layer != "target" else draw(st.sampled_from(ODD_TARGETS))
        headers, body, trick, refuses = draw(_headers(t, body=b"", post=False))
        return HttpDraft(f"{layer}:{method.decode('latin-1')} {path} {trick}", method, target,
                         tuple(headers), body, refuses and method in (b"GET", b"HEAD"))
    path = draw(st.sampled_from(tuple(POST_ROUTES)))
    make, _ = POST_ROUTES[path]
    method = b"POST"
    if layer == "field":
        value, what = draw(_mutated(t, path))
        raw = dump(value).encode()
    elif layer == "json":
        raw, what = draw(_json_body(t, path))
    else:
        raw, what = dump(draw(make(t))).encode(), "valid"
    if layer == "method":
        method = draw(st.sampled_from(WRONG_METHODS))
        what = f"method {method!r}"
    headers, raw, trick, refuses = draw(_headers(
        t, body=raw, post=True) if layer == "headers" else _plain_headers(t, raw))
    return HttpDraft(f"{layer}:{path} {what} {trick}".rstrip(), method, path.encode(),
                     tuple(headers), raw, refuses and method == b"POST")


@st.composite
def _plain_headers(draw: st.DrawFn, t: Target, body: bytes
                   ) -> tuple[list[tuple[bytes, bytes]], bytes, str, bool]:
    headers = [(b"Host", b"127.0.0.1:%d" % t.port),
               (b"Content-Type", draw(st.sampled_from(JSON_TYPES))),
               (b"Content-Length", str(len(body)).encode()), (b"Connection", b"close")]
    if t.api_key:
        headers.append((b"Authorization", b"Bearer " + t.api_key.encode()))
    return headers, body, "", False
