"""Which grammar engine: llguidance, outlines-core and xgrammar on SmolLM2's tokenizer.

A development tool, not part of the runtime (``docs/structured-output.md`` reports its
figures and the choice they made). Only llguidance is a dependency of the runtime; the
other two are installed by hand to run this (``pip install outlines-core xgrammar``;
xgrammar declares and imports torch, which is why it lost before timing started).

For each engine and each schema it measures, on the same token sequence (a valid
answer, tokenised as the model would write it):

* ``setup_ms`` — tokenizer wrapping, once per model (cached by the runtime);
* ``compile_ms`` — schema -> matcher, once per job (the first, cold compile);
* ``mask_us`` — computing the allowed-token mask for one step (median, p99), the cost
  paid at every generated token; ``apply_us`` — putting that mask on the logits
  (numpy, the same code for every engine);
* ``correct`` — every token of the valid answer allowed, and a token that breaks the
  schema refused, and the end accepted.

Run: ``python -m uniun.runtime.bench.grammar_engines --model-dir DIR [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from uniun.models.constrain import JSON_OPTIONS, apply_bitmask

EXTRACTION_ANSWER = {
    "entities": [{"name": "Ada Lovelace", "type": "person"},
                 {"name": "Charles Babbage", "type": "person"},
                 {"name": "Analytical Engine", "type": "thing"},
                 {"name": "London", "type": "place"}],
    "relations": [{"source": "Ada Lovelace", "relation": "worked with",
                   "target": "Charles Babbage"},
                  {"source": "Ada Lovelace", "relation": "worked on",
                   "target": "Analytical Engine"}],
}
PERSON_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
    "required": ["name", "age", "tags"], "additionalProperties": False}
PERSON_ANSWER = {"name": "Grace Hopper", "age": 85, "tags": ["navy", "COBOL", "compilers"]}


def _cases() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    from uniun.actors.producers.extraction import EXTRACTION_SCHEMA

    return [("extraction", EXTRACTION_SCHEMA, EXTRACTION_ANSWER),
            ("person", PERSON_SCHEMA, PERSON_ANSWER)]


class _Engine(Protocol):
    """One engine behind three calls: start(schema), mask() -> int32 bits, consume(token)."""

    name: str = ""

    def start(self, schema: dict[str, Any]) -> None: ...

    def mask(self) -> np.ndarray: ...

    def consume(self, token: int) -> bool: ...

    def accepting(self) -> bool: ...


class _LLGuidance(_Engine):
    name = "llguidance"

    def __init__(self, hf_tok: Any, vocab: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.numpy as lln

        self._llg, self._lln = llguidance, lln
        self.tok = llguidance.hf.from_tokenizer(hf_tok, n_vocab=vocab)
        self.bits = lln.allocate_token_bitmask(1, vocab)

    def start(self, schema: dict[str, Any]) -> None:
        grammar = self._llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        self.m = self._llg.LLMatcher(self.tok, grammar, log_level=0)
        assert not self.m.is_error(), self.m.get_error()

    def mask(self) -> np.ndarray:
        self._lln.fill_next_token_bitmask(self.m, self.bits, 0)
        return self.bits[0]

    def consume(self, token: int) -> bool:
        return bool(self.m.consume_token(token)) and not self.m.is_error()

    def accepting(self) -> bool:
        return bool(self.m.is_accepting())


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet back to bytes (SmolLM2's tokens are written in it)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class _OutlinesCore(_Engine):
    name = "outlines-core"

    def __init__(self, hf_tok: Any, vocab: int) -> None:
        import outlines_core as oc
        from outlines_core.json_schema import build_regex_from_schema

        self._oc, self._regex = oc, build_regex_from_schema
        decoder = _byte_decoder()
        eos = hf_tok.convert_tokens_to_ids("<|im_end|>")
        table: dict[bytes, list[int]] = {}
        for token, tid in hf_tok.get_vocab().items():
            if tid == eos or tid >= vocab or (token.startswith("<|") and token.endswith("|>")):
                continue
            table.setdefault(bytes(decoder[c] for c in token), []).append(tid)
        self.vocab_obj = oc.Vocabulary(eos, table)
        self.vocab = vocab
        self.bits = np.zeros((vocab + 31) // 32, dtype=np.int32)

    def start(self, schema: dict[str, Any]) -> None:
        index = self._oc.Index(self._regex(json.dumps(schema)), self.vocab_obj)
        self.g = self._oc.Guide(index)

    def mask(self) -> np.ndarray:
        self.g.write_mask_into(self.bits.ctypes.data, self.bits.size, 4)
        return self.bits

    def consume(self, token: int) -> bool:
        try:
            self.g.advance(token)
        except (ValueError, RuntimeError):
            return False
        return True

    def accepting(self) -> bool:
        return bool(self.g.is_finished())


class _XGrammar(_Engine):
    name = "xgrammar"

    def __init__(self, hf_tok: Any, vocab: int) -> None:
        import xgrammar as xgr  # imports torch

        self._xgr = xgr
        self.eos = hf_tok.convert_tokens_to_ids("<|im_end|>")
        info = xgr.TokenizerInfo.from_huggingface(hf_tok, vocab_size=vocab,
                                                  stop_token_ids=[self.eos])
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        self.bits = xgr.allocate_token_bitmask(1, vocab)

    def start(self, schema: dict[str, Any]) -> None:
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                separators=(", ", ": "))
        self.m = self._xgr.GrammarMatcher(compiled)

    def mask(self) -> np.ndarray:
        self.m.fill_next_token_bitmask(self.bits)
        return self.bits[0].numpy()

    def consume(self, token: int) -> bool:
        return bool(self.m.accept_token(token))

    def accepting(self) -> bool:
        return bool(self.m.accept_token(self.eos)) or bool(self.m.is_terminated())


def _allowed(bits: np.ndarray, token: int) -> bool:
    return bool((int(bits[token // 32]) >> (token % 32)) & 1)


def measure(engine: _Engine, schema: dict[str, Any], tokens: Sequence[int], bad: int,
            vocab: int, reps: int = 3) -> dict[str, Any]:
    """Compile time, per-step mask time and correctness of one engine on one schema."""
    compile_s: list[float] = []
    mask_s: list[float] = []
    apply_s: list[float] = []
    correct = True
    logits = np.random.default_rng(0).standard_normal(vocab).astype(np.float32)
    for _ in range(reps):
        t0 = time.perf_counter()
        engine.start(schema)
        compile_s.append(time.perf_counter() - t0)
        for i, token in enumerate(tokens):
            t0 = time.perf_counter()
            bits = engine.mask()
            mask_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            apply_bitmask(logits.copy(), bits)
            apply_s.append(time.perf_counter() - t0)
            if not _allowed(bits, token):
                correct = False
            if i == len(tokens) // 2 and _allowed(bits, bad):
                correct = False  # a schema-breaking token must be refused mid-answer
            if not engine.consume(token):
                correct = False
                break
        correct = correct and engine.accepting()
    mask_s.sort()
    return {"compile_ms": round(compile_s[0] * 1e3, 2),  # cold: the first job's cost
            "mask_us_median": round(statistics.median(mask_s) * 1e6, 1),
            "mask_us_p99": round(mask_s[int(0.99 * (len(mask_s) - 1))] * 1e6, 1),
            "apply_us_median": round(statistics.median(apply_s) * 1e6, 1),
            "tokens": len(tokens), "correct": correct}


def run(model_dir: Path, engines: Sequence[str]) -> dict[str, Any]:
    from transformers import PreTrainedTokenizerFast

    hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))
    config = json.loads((model_dir / "config.json").read_text())
    vocab = int(config["vocab_size"])
    makers: dict[str, Callable[[Any, int], _Engine]] = {
        "llguidance": _LLGuidance, "outlines-core": _OutlinesCore, "xgrammar": _XGrammar}
    bad = hf_tok.encode("}}}", add_special_tokens=False)[0]
    out: dict[str, Any] = {"vocab": vocab, "engines": {}}
    for name in engines:
        t0 = time.perf_counter()
        try:
            engine = makers[name](hf_tok, vocab)
        except Exception as err:  # noqa: BLE001 - not installed, or needs torch
            out["engines"][name] = {"error": f"{type(err).__name__}: {err}"[:300]}
            continue
        result: dict[str, Any] = {"setup_ms": round((time.perf_counter() - t0) * 1e3, 1)}
        for case, schema, answer in _cases():
            text = json.dumps(answer)  # ", " and ": ", the runtime's JSON style
            tokens = hf_tok.encode(text, add_special_tokens=False)
            try:
                result[case] = measure(engine, schema, tokens, bad, vocab)
            except Exception as err:  # noqa: BLE001 - recorded as the case's error
                result[case] = {"error": f"{type(err).__name__}: {err}"[:300]}
        out["engines"][name] = result
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uniun.runtime.bench.grammar_engines",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path,
                        default=Path.home() / ".uniun" / "models" / "smollm2-135m-instruct")
    parser.add_argument("--engines", default="llguidance,outlines-core,xgrammar")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    result = run(args.model_dir, args.engines.split(","))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
