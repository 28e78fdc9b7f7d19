"""Hypothesis strategies for hostile front frames: every request type, every job-map field.

Why a strategy per field rather than random maps: random maps almost never get past the
envelope check, so the job-map validation, the model-name check and the handlers behind
them would go untested. Each field is drawn either from values the server must accept or
from values it must refuse (wrong types, out of range, path-like model ids, NUL bytes,
NaN, huge numbers), so one frame exercises one layer deeper than the last.

A drawn :class:`Draft` says whether the driver (``fuzz.py``) should put a fresh, valid
message id into it; only then is a reply with ``re`` due. A hostile id is never a valid
id string, so a reply is always attributable.

Model ids are never ones the runtime could go and build or download (``tiny-N`` for a
new N, a recipe name): a fuzz run must not write models into the store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgpack
from hypothesis import strategies as st

__all__ = ["Draft", "drafts", "HOSTILE_MODEL_IDS", "JOB_IDS"]

REQUEST_TYPES = ("submit", "cancel", "attach", "foreground", "lifecycle", "status", "ping")
KINDS = ("chat", "extract", "nataraj", "gana")
JOB_IDS = tuple(f"fz-job-{i}" for i in range(8))  # shared, so cancel/attach hit real jobs
# The model-store name format refuses all of these (PROTOCOL: unknown_model or
# invalid_field, never internal); the last two pass the format but name no model.
HOSTILE_MODEL_IDS = (".", "..", "/tmp", "../../etc/passwd", "\U0001F600", "tiny-1\x00",
                     "tiny-1\n", "\ntiny-1", "tiny-1/", "TINY-1", " tiny-1", "tiny-01\x00x",
                     "a" * 65, "a" * 200, "-tiny", ".hidden", "C:\\models",
                     "no-such-model", "all-minilm-l6-v2")


@dataclass(frozen=True)
class Draft:
    """One hostile frame: ``raw`` frames as they are, or ``msg`` to pack.

    ``wants_id``: the driver sets ``msg["id"]`` to a fresh valid id, and a reply with
    that ``re`` is due; otherwise one reply without ``re`` is due.
    """

    msg: Any = None
    raw: tuple[bytes, ...] | None = None
    wants_id: bool = False
    label: str = ""


# ---- leaves -------------------------------------------------------------------------

_INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
_FLOATS = st.floats(allow_nan=True, allow_infinity=True)
_TEXT = st.text(max_size=40)
_SCALARS = st.one_of(st.none(), st.booleans(), _INT64, _FLOATS, _TEXT, st.binary(max_size=20))
_ANY = st.recursive(_SCALARS, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(_TEXT, kids, max_size=4)), max_leaves=12)
_HOSTILE_ID = st.one_of(st.none(), st.just(""), st.text(min_size=129, max_size=140),
                        _INT64, _FLOATS, st.binary(max_size=8), st.lists(_TEXT, max_size=2),
                        st.booleans())


def _either(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly good values (so the next field is reached), sometimes bad ones."""
    return st.one_of(good, good, good, bad)


_GOOD_JOB_ID = st.one_of(st.sampled_from(JOB_IDS), st.text(min_size=1, max_size=128))
_BAD_JOB_ID = st.one_of(st.just(""), st.text(min_size=129, max_size=150), _INT64,
                        st.none(), st.binary(max_size=4), st.lists(_TEXT, max_size=2))
_MESSAGES = st.lists(st.fixed_dictionaries(
    {"role": _either(st.sampled_from(("system", "user", "assistant")), _ANY),
     "content": _either(st.text(max_size=60), _ANY)}), min_size=1, max_size=3)
_MESSAGES_OK = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(("system", "user", "assistant")),
     "content": st.text(max_size=40)}), min_size=1, max_size=3)
_SAMPLING_OK = st.fixed_dictionaries({}, optional={
    "temperature": st.floats(0.0, 2.0), "top_p": st.floats(0.01, 1.0),
    "top_k": st.integers(0, 50), "seed": st.integers(0, 2**63 - 1)})
_SAMPLING = st.fixed_dictionaries({}, optional={
    "temperature": _either(st.floats(0.0, 2.0), _ANY),
    "top_p": _either(st.floats(0.01, 1.0), _ANY),
    "top_k": _either(st.integers(0, 50), _ANY),
    "seed": _either(st.integers(0, 2**63 - 1), _ANY),
    "bogus": _ANY})
_SCHEMAS = st.sampled_from([
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "string", "pattern": "("}, {"type": "nonsense"}, {"$ref": "#/nowhere"},
    {"type": "array", "items": {"$ref": "#"}}, {"enum": []}, {"type": "integer",
                                                              "minimum": 5, "maximum": 1},
    {"anyOf": "x"}, {"type": ["string", 7]}, {"properties": {"x": 1}},
])
_FORMAT = st.one_of(st.just({"type": "json_object"}),
                    st.fixed_dictionaries({"type": st.just("json_schema"), "schema": _SCHEMAS}),
                    st.dictionaries(_TEXT, _ANY, max_size=3), _ANY)
_DEADLINE = st.one_of(st.none(), st.floats(0, 4e9), st.just(math.nan), st.just(math.inf),
                      st.just(1e308), st.just(-1.0), _ANY)

# Per job-map field: values a job may carry, and values it must be refused for.
_GOOD: dict[str, st.SearchStrategy[Any]] = {
    "model_id": st.none(),  # the runtime's default model: never one it would build
    "max_new_tokens": st.integers(1, 4),
    "deadline": st.one_of(st.none(), st.floats(0, 4e9)),
    "foreground_hint": st.booleans(),
    "flow": st.text(min_size=1, max_size=20),
    "stream": st.booleans(),
    "sampling": _SAMPLING_OK,
    "stop": st.one_of(st.text(min_size=1, max_size=8),
                      st.lists(st.text(min_size=1, max_size=8), max_size=4)),
    "format": st.one_of(st.just({"type": "json_object"}), st.just(
        {"type": "json_schema", "schema": {"type": "object", "properties": {
            "a": {"type": "integer"}}, "required": ["a"]}})),
}
_BAD: dict[str, st.SearchStrategy[Any]] = {
    "job_id": _BAD_JOB_ID,
    "kind": st.one_of(_TEXT, _ANY),
    "prompt": _ANY,
    "messages": st.one_of(_MESSAGES, _ANY),
    "model_id": st.one_of(st.sampled_from(HOSTILE_MODEL_IDS), st.sampled_from(
        HOSTILE_MODEL_IDS), _TEXT, _ANY),
    "max_new_tokens": st.one_of(st.sampled_from([0, -1, 2**31, 2**63, 10**6]), _ANY),
    "deadline": _DEADLINE,
    "foreground_hint": _ANY,
    "flow": _ANY,
    "stream": _ANY,
    "sampling": st.one_of(_SAMPLING, _ANY),
    "stop": st.one_of(st.lists(_ANY, max_size=6), _ANY),
    "format": _FORMAT,
    "dead_line": _ANY,  # an unknown key
}
_HUGE = st.integers(100_000, 600_000).map(lambda n: "k" * n)  # echoed whole, over a frame


@st.composite
def _huge_key(draw: st.DrawFn, job: dict[str, Any]) -> None:
    """A key of hundreds of KB: unknown at the top, in ``sampling`` or in ``format``."""
    where = draw(st.sampled_from(("job", "sampling", "format")))
    if where == "job":
        job[draw(_HUGE)] = 1
    else:
        job[where] = {draw(_HUGE): 1}


@st.composite
def _job_map(draw: st.DrawFn) -> Any:
    """A valid job with 0-2 fields made hostile (or, rarely, no map at all)."""
    if draw(st.integers(0, 29)) == 0:
        return draw(_ANY)
    job: dict[str, Any] = {"job_id": draw(_GOOD_JOB_ID), "kind": draw(st.sampled_from(KINDS))}
    if draw(st.booleans()):
        job["prompt"] = draw(st.text(min_size=1, max_size=40))
    else:
        job["messages"] = draw(_MESSAGES_OK)
    job["max_new_tokens"] = draw(_GOOD["max_new_tokens"])
    for key, strategy in _GOOD.items():
        if key != "max_new_tokens" and draw(st.integers(0, 5)) == 0:
            job[key] = draw(strategy)
    if draw(st.integers(0, 59)) == 0:
        draw(_huge_key(job))
    for _ in range(draw(st.sampled_from((0, 0, 1, 1, 2)))):
        key = draw(st.sampled_from(sorted(_BAD)))
        if draw(st.integers(0, 7)) == 0:
            job.pop(key, None)  # a required field missing, or an optional one
        else:
            job[key] = draw(_BAD[key])
    return job


def _body(mtype: str) -> st.SearchStrategy[dict[str, Any]]:
    if mtype == "submit":
        return st.fixed_dictionaries({"job": _job_map()})
    if mtype in ("cancel", "attach"):
        opt: dict[str, st.SearchStrategy[Any]] = {
            "after_seq": _either(st.integers(-1, 50), _ANY)} if mtype == "attach" else {}
        return st.fixed_dictionaries({}, optional={"job_id": _either(_GOOD_JOB_ID, _BAD_JOB_ID),
                                                   **opt})
    if mtype == "foreground":
        return st.fixed_dictionaries({}, optional={
            "kind": _either(st.one_of(st.none(), st.sampled_from(KINDS)), _ANY)})
    if mtype == "lifecycle":
        return st.fixed_dictionaries({}, optional={
            "state": _either(st.sampled_from(("foreground", "background")), _ANY)})
    return st.fixed_dictionaries({}, optional={"extra": _ANY})  # status, ping


@st.composite
def _request(draw: st.DrawFn) -> Draft:
    known = draw(st.integers(0, 7)) != 0
    mtype = draw(st.sampled_from(REQUEST_TYPES) if known else st.one_of(_TEXT, _ANY))
    msg: dict[str, Any] = dict(draw(_body(mtype))) if isinstance(mtype, str) else {}
    msg["type"] = mtype
    version = draw(st.sampled_from((1,) * 30 + (0, 2, None, "1", 1.0, True, 2**40, "missing")))
    if version != "missing":
        msg["v"] = version
    wants_id = draw(st.integers(0, 11)) != 0
    if not wants_id:
        bad = draw(st.one_of(st.just("missing"), _HOSTILE_ID))
        if bad != "missing":
            msg["id"] = bad
    label = mtype if mtype in REQUEST_TYPES else "other-type"
    return Draft(msg=msg, wants_id=wants_id, label=label)


@st.composite
def _raw(draw: st.DrawFn) -> Draft:
    """Frames that are not one msgpack map: garbage, other values, several frames."""
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return Draft(raw=(draw(st.binary(max_size=64)),), label="raw-bytes")
    if choice == 1:
        value = draw(st.one_of(_SCALARS, st.lists(_ANY, max_size=3)))
        return Draft(raw=(msgpack.packb(value, use_bin_type=True),), label="not-a-map")
    if choice == 2:
        key = draw(st.one_of(_INT64, st.binary(max_size=4), st.booleans()))
        return Draft(raw=(msgpack.packb({key: 1, "v": 1}, use_bin_type=True),),
                     label="non-str-key")
    if choice == 3:
        parts = draw(st.lists(st.binary(max_size=16), min_size=2, max_size=4))
        return Draft(raw=tuple(parts), label="multi-frame")
    if choice == 4:
        depth = draw(st.integers(17, 40))
        nested: Any = 1
        for _ in range(depth):
            nested = [nested]
        return Draft(raw=(msgpack.packb({"v": 1, "type": "ping", "x": nested}),),
                     label="too-deep")
    good = msgpack.packb({"v": 1, "type": "ping", "id": "x"})
    return Draft(raw=(good + draw(st.binary(min_size=1, max_size=8)),), label="trailing-bytes")


def drafts() -> st.SearchStrategy[Draft]:
    """Mostly requests of the seven types with fuzzed fields; some raw garbage."""
    return st.one_of(_request(), _request(), _request(), _raw())
