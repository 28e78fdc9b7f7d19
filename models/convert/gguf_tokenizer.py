"""The tokenizer and chat template of a GGUF, rebuilt from its metadata with ``tokenizers``.

Two tokenizer models occur in the supported families:

- ``gpt2`` (SmolLM2, Llama 3.x, Qwen2): byte-level BPE with the file's merges; llama.cpp's
  pre-tokenizer name says whether digits are split one by one.
- ``llama`` (SentencePiece BPE: Gemma 3, TinyLlama): no merges are stored, only a score
  per piece; llama.cpp merges the adjacent pair whose concatenation scores highest. The
  same result comes from a BPE whose merges are every (left, right) split of a vocabulary
  piece, ranked by that piece's score (what HF's SentencePiece extractor does), with
  byte fallback for the ``<0xNN>`` pieces, spaces written as U+2581 and a leading one
  added when ``tokenizer.ggml.add_space_prefix`` says so.

Control tokens become special added tokens. A file without ``tokenizer.chat_template``
(a base model such as Gemma 3 270M) gets no template: chat requests are refused with
"send a raw prompt" and completion-style prompts work (docs/models.md).
"""

from __future__ import annotations

from typing import Any

from uniun.models.convert.gguf_families import GgufError, field
from uniun.models.convert.hf_folder import tokenizer_config

__all__ = ["read_tokenizer"]

# llama.cpp pre-tokenizer names that are GPT-2 byte-level with single-digit splitting.
_DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "deepseek-coder", "qwen2", "llama3",
                    "llama-bpe"}
_CONTROL, _USER_DEFINED, _BYTE = 3, 4, 6
_SPACE = "\u2581"


def _gpt2(reader: Any, tokens: list[str], types: list[int]) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges") or []]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    pre = field(reader, "tokenizer.ggml.pre", "default")
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                  byte_level])
                         if pre in _DIGIT_SPLIT_PRE else byte_level)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    control = [t for t, ty in zip(tokens, types) if ty in (_CONTROL, _USER_DEFINED)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    return tok


def _spm_merges(tokens: list[str], types: list[int], scores: list[float]
                ) -> list[tuple[str, str]]:
    """Every split of a normal piece into two pieces, best-scoring merged piece first."""
    vocab = {t: i for i, t in enumerate(tokens) if types[i] in (1, _USER_DEFINED)}
    found: list[tuple[float, int, int, str, str]] = []
    for piece, idx in vocab.items():
        if types[idx] != 1:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                found.append((-scores[idx], idx, cut, left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def _spm(reader: Any, tokens: list[str], types: list[int]) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    scores = [float(s) for s in field(reader, "tokenizer.ggml.scores")
              or [-float(i) for i in range(len(tokens))]]
    unk_id = field(reader, "tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unk_id)] if unk_id is not None else None
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=_spm_merges(tokens, types, scores),
                               unk_token=unk, fuse_unk=True, byte_fallback=True))
    prefix = bool(field(reader, "tokenizer.ggml.add_space_prefix", True))
    steps = [normalizers.Prepend(_SPACE)] if prefix else []
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", _SPACE)])
    decode = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(decode + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == _CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == _USER_DEFINED])
    bos_id = field(reader, "tokenizer.ggml.bos_token_id")
    if field(reader, "tokenizer.ggml.add_bos_token", True) and bos_id is not None:
        bos = tokens[int(bos_id)]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, int(bos_id))])
    return tok


def read_tokenizer(reader: Any, arch: str) -> tuple[str, dict[str, Any]]:
    """``tokenizer.json`` text and ``tokenizer_config.json`` dict from the metadata."""
    kind = field(reader, "tokenizer.ggml.model")
    tokens: list[str] = list(field(reader, "tokenizer.ggml.tokens") or [])
    types: list[int] = list(field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens))
    if not tokens:
        raise GgufError("the GGUF has no tokenizer.ggml.tokens")
    if kind == "gpt2":
        tok = _gpt2(reader, tokens, types)
    elif kind == "llama":
        tok = _spm(reader, tokens, types)
    else:
        raise GgufError(f"tokenizer model {kind!r} is not supported "
                        "(supported: gpt2 byte-level BPE, llama SentencePiece BPE)")

    def name(key: str) -> str | None:
        idx = field(reader, f"tokenizer.ggml.{key}_token_id")
        return None if idx is None else tokens[int(idx)]

    bos, eos = name("bos"), name("eos")
    control = [t for t, ty in zip(tokens, types) if ty == _CONTROL or
               (kind == "gpt2" and ty == _USER_DEFINED)]
    cfg = tokenizer_config(
        bos, eos, field(reader, "tokenizer.chat_template") or "", pad=name("padding"),
        unk=name("unknown"), additional=[t for t in control if t not in (bos, eos)],
        add_bos=bool(field(reader, "tokenizer.ggml.add_bos_token", kind == "llama")),
        max_length=int(field(reader, f"{arch}.context_length", 2048)))
    if not cfg["chat_template"]:
        del cfg["chat_template"]  # a base model: raw prompts only
    return tok.to_str(), cfg
