"""Constrained decoding: a grammar's token mask on the logits at every step.

A job with a ``format`` (``{"type": "json_object"}`` or ``{"type": "json_schema",
"schema": {...}}``, docs/structured-output.md) can only produce text that the format
allows: before each token is sampled, the grammar engine computes which tokens may come
next and every other logit is set to -inf. When the grammar is complete only EOS is
left, so the job ends with ``finish_reason: stop`` and its text parses; only
``max_new_tokens`` can cut it short (``length``).

The engine is llguidance (Microsoft's Rust engine, the one behind Guidance and
llama.cpp's ``%llguidance`` grammars): it reads a Hugging Face ``tokenizer.json``
directly, fills a numpy bitmask, and needs no torch. Why it won over outlines-core and
xgrammar is measured in ``runtime/bench/grammar_engines.py`` and reported in
docs/structured-output.md.

Pause and resume keep the grammar state exact without storing it: the matcher's state is
a pure function of the generated ids, so a :class:`Constraint` built for a resumed or
recomputed job replays them (``consume_tokens``, well under a millisecond for hundreds of
tokens) before its first mask. Nothing grammar-related lives in a parked snapshot; the
``format`` travels in the job's :class:`~uniun.models.kv.JobProgress`.

Costs: wrapping a tokenizer takes ~0.5 s, so it is done once per tokenizer and cached;
compiling a schema is a few milliseconds per job; a mask is tens of microseconds per
token. ``Constraint.mask_s`` sums the time spent masking, for the benchmarks.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the options' type is in the engine's stubs only (imported lazily below)
    from llguidance._lib import JsonCompileOptions

__all__ = ["FORMAT_TYPES", "FormatError", "ConstraintError", "Constraint", "check_format",
           "grammar_for", "apply_bitmask", "token_bytes"]

FORMAT_TYPES = ("json_object", "json_schema")
# Compact JSON in json.dumps' default style (", " and ": "), no free whitespace: a small
# model given room for whitespace can fill max_new_tokens with newlines.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ",
                                    "key_separator": ": "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


class FormatError(ValueError):
    """A ``format`` the grammar engine cannot compile; the message says why."""


class ConstraintError(RuntimeError):
    """The grammar refused a token or left none allowed (an engine bug, or a bad state)."""


def _schema_of(fmt: Mapping[str, Any]) -> Any:
    kind = fmt.get("type")
    if kind == "json_object":
        return ANY_OBJECT
    if kind == "json_schema":
        return fmt.get("schema")
    raise FormatError(f"type must be one of {', '.join(FORMAT_TYPES)}")


def grammar_for(fmt: Mapping[str, Any]) -> str:
    """The llguidance grammar of a format map (not yet checked).

    Besides the job map's two types, the runner's own ``{"type": "tools", "tools": [...],
    "choice": ..., "format"?: <format map>}`` for a job with tools (``models/tools.py``).
    """
    import llguidance

    if fmt.get("type") == "tools":
        from uniun.models.tools import tool_grammar

        text = fmt.get("format")
        try:
            return llguidance.LLMatcher.grammar_from_lark(tool_grammar(
                fmt["tools"], fmt.get("choice", "auto"),
                _schema_of(text) if text else None))
        except ValueError as err:
            raise FormatError(str(err)) from None
    schema = _schema_of(fmt)
    if not isinstance(schema, dict):
        raise FormatError("must be a JSON Schema object")
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except ValueError as err:
        raise FormatError(str(err)) from None


def check_format(fmt: Mapping[str, Any]) -> None:
    """Raise :class:`FormatError` unless ``fmt`` compiles (no tokenizer needed; ~ms)."""
    import llguidance

    error = llguidance.LLMatcher.validate_grammar(grammar_for(fmt))
    if error:
        raise FormatError(error.strip()[:300])


# One wrapped tokenizer per (tokenizer object, vocab size, EOS ids): wrapping costs
# ~0.5 s. The EOS ids are part of the key: a job that ignores EOS must not share a
# wrapper whose grammar end is another job's EOS.
_TOKENIZERS: weakref.WeakKeyDictionary[Any, dict[tuple[int, tuple[int, ...]], Any]] = \
    weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _ll_tokenizer(tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]) -> Any:
    import llguidance

    key = (int(vocab_size), tuple(int(t) for t in eos_ids))
    with _LOCK:
        per_size = _TOKENIZERS.setdefault(tokenizer, {})
        wrapped = per_size.get(key)
        if wrapped is None:
            backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
            eos: Any = list(eos_ids) if eos_ids else getattr(tokenizer, "eos_token_id", None)
            wrapped = llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab_size,
                                             eos_token=eos)
            per_size[key] = wrapped
        return wrapped


# Token bytes already looked up, per tokenizer: a logprobs job asks for ~21 per token.
_BYTES: weakref.WeakKeyDictionary[Any, dict[int, bytes]] = weakref.WeakKeyDictionary()


def token_bytes(tokenizer: Any, vocab_size: int, eos_ids: Sequence[int], token: int) -> bytes:
    """The bytes one token stands for (a token may hold part of a UTF-8 character)."""
    cache = _BYTES.get(tokenizer)
    if cache is not None and token in cache:
        return cache[token]
    with _LOCK:
        per_size = _TOKENIZERS.get(tokenizer) or {}
        wrapped = next((w for (size, _), w in per_size.items() if size == vocab_size), None)
    if wrapped is None:
        wrapped = _ll_tokenizer(tokenizer, vocab_size, eos_ids)
    raw = bytes(wrapped.decode_bytes([int(token)]))
    with _LOCK:
        _BYTES.setdefault(tokenizer, {})[int(token)] = raw
    return raw


def apply_bitmask(logits: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """``logits`` with every token whose bit is 0 set to -inf (a new array)."""
    allowed = np.unpackbits(np.ascontiguousarray(bits).view(np.uint8),
                            bitorder="little")[: logits.shape[-1]].astype(bool)
    if allowed.shape[0] < logits.shape[-1]:
        allowed = np.pad(allowed, (0, logits.shape[-1] - allowed.shape[0]))
    return np.where(allowed, logits, np.float32(-np.inf)).astype(logits.dtype, copy=False)


class Constraint:
    """One job's grammar matcher; see the module docstring.

    Built lazily on the first :meth:`mask` (the logits tell the vocabulary size), at
    which point the tokens generated before a pause are replayed.
    """

    def __init__(self, fmt: Mapping[str, Any], tokenizer: Any, eos_ids: Sequence[int],
                 generated_ids: Sequence[int] = ()) -> None:
        self.format = dict(fmt)
        self._grammar = grammar_for(self.format)
        self._tokenizer = tokenizer
        self._eos_ids = tuple(eos_ids)
        self._pending = [int(t) for t in generated_ids]  # replayed when the matcher is built
        self._matcher: Any = None
        self._bits: np.ndarray | None = None
        self.mask_s = 0.0  # seconds spent computing and applying masks, per-token work
        self.masks = 0  # masks computed
        self.build_s = 0.0  # seconds of the one-off build (tokenizer wrap when not cached,
        # schema compile, replay of the tokens generated before a pause)

    def _build(self, vocab_size: int) -> None:
        import llguidance

        matcher = llguidance.LLMatcher(_ll_tokenizer(self._tokenizer, vocab_size, self._eos_ids),
                                       self._grammar, log_level=0)
        if matcher.is_error():
            raise ConstraintError(f"grammar: {matcher.get_error()}")
        if self._pending and not matcher.consume_tokens(self._pending):
            raise ConstraintError(f"replaying {len(self._pending)} generated tokens: "
                                  f"{matcher.get_error()}")
        self._pending = []
        self._matcher = matcher
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """The logits of the next step with every token the grammar forbids at -inf."""
        if self._matcher is None:
            t0 = time.perf_counter()
            self._build(int(logits.shape[-1]))
            self.build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        assert self._bits is not None
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if self._matcher.is_error() or not self._bits.any():
            raise ConstraintError(f"no token allowed: {self._matcher.get_error()}")
        masked = apply_bitmask(logits, self._bits)
        self.mask_s += time.perf_counter() - t0
        self.masks += 1
        return masked

    def consume(self, token_id: int) -> None:
        """Advance the grammar by the token that was sampled (it was allowed)."""
        if self._matcher is None:
            self._pending.append(int(token_id))
            return
        if int(token_id) in self._eos_ids and self._matcher.is_accepting():
            return  # the end; llguidance would accept it too, but nothing follows
        if not self._matcher.consume_token(int(token_id)):
            raise ConstraintError(f"token {token_id} refused: {self._matcher.get_error()}")

    def describe(self) -> str:
        return json.dumps(self.format, sort_keys=True)[:200]
