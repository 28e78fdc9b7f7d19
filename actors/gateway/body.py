"""A request body as JSON, parsed so that every client mistake is a 400, never a 5xx.

Why more than ``json.loads``: it accepts things that break later, far from the request
that caused them. ``NaN`` and ``Infinity`` (not JSON) become floats, and so does
``1e999`` (infinity); ``"\\ud800"`` (a lone surrogate, not Unicode) becomes a ``str``
that no UTF-8 encoder will take, so the job could not be sent to the scheduler and the
answer could not be written; an integer like ``2**64`` does not fit the protocol's
64-bit integers; ``[[[[...]]]]`` nested 100,000 deep exhausts the parser's recursion
(``RecursionError``); a deep but parsable document exceeds the protocol's nesting
limit. Each of these is refused here, with the parameter that holds it, before any
field is read.

And the last net, :func:`carriable`: the job map encoded exactly as the protocol client
will send it, under the client's own limits, so nothing a request holds can fail on its
way out (as a 5xx) after the door and the mapping let it through.

Pure: no I/O.
"""

from __future__ import annotations

import json
import math
from typing import Any

from uniun.actors.gateway.errors import ApiError
from uniun.protocol.codec import DEFAULT_LIMITS, EncodeError, encode

__all__ = ["MAX_DEPTH", "carriable", "parse_json"]

MAX_DEPTH = 32  # containers nested in a body, the body itself being depth 1
INT_MIN, INT_MAX = -(2**63), 2**64 - 1  # what msgpack (and the protocol) carries


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code="bad_envelope")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: bytes) -> Any:
    """The body's JSON value, or :class:`ApiError` 400 naming what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _bad(f"the body is not UTF-8 (byte {err.start})") from None
    try:
        value = json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as err:
        raise _bad(f"the body is not JSON: {err.msg} (line {err.lineno}, column "
                   f"{err.colno})") from None
    except RecursionError:
        raise _bad(f"the body is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:  # NaN / Infinity, or a number of too many digits
        reason = str(err) if "not JSON" in str(err) else "a number has too many digits"
        raise _bad(f"the body is not JSON: {reason}") from None
    _check_tree(value)
    return value


def _check_tree(root: Any) -> None:
    """Depth, lone surrogates and integer range, iteratively (no recursion to exhaust)."""
    stack: list[tuple[Any, int, str]] = [(root, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > MAX_DEPTH:
                raise _bad(f"the body is nested deeper than {MAX_DEPTH} levels",
                           path or None)
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, child in items:
                if isinstance(key, str):
                    _check_text(key, path or None)
                    where = f"{path}.{key}" if path else key
                else:
                    where = f"{path}[{key}]"
                stack.append((child, depth + 1, where))
        elif isinstance(node, str):
            _check_text(node, path or None)
        elif isinstance(node, int) and not isinstance(node, bool) \
                and not INT_MIN <= node <= INT_MAX:
            raise _bad("an integer is out of the range the runtime carries "
                       "(-2^63 to 2^64-1)", path or None)
        elif isinstance(node, float) and not math.isfinite(node):  # 1e999 parses as inf
            raise _bad("a number is out of the range of a 64-bit float", path or None)


def _check_text(text: str, param: str | None) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad("a string holds a lone surrogate (\\ud800-\\udfff), which is not "
                   "Unicode text", param) from None


def carriable(job: dict[str, Any]) -> None:
    """Raise :class:`ApiError` 400 unless ``job`` fits in a ``submit`` frame."""
    try:
        encode({"v": 1, "type": "submit", "id": "x" * 32, "job": job}, DEFAULT_LIMITS)
    except EncodeError as err:
        raise _bad(f"the request cannot be sent to the scheduler: {err}") from None
