"""Read a llama-architecture GGUF: config, weights (kept block-quantized), tokenizer.

What the GGUF holds and how it maps to our folder:

- ``llama.*`` metadata -> :class:`DecoderConfig` (rope base, eps, heads, context).
- Tensors: Q4_1 and Q8_0 blocks (32 values each) map *exactly* onto
  ``MatMulNBits`` (4-bit codes with a per-block offset, see ``BlockQuantized``; 8-bit
  with the default zero point 128), so no precision is lost converting and the graph
  runs the compact weights directly. F32/F16 stay float; any other type is dequantised with
  ``gguf.quants.dequantize`` (correct but bigger and slower).
- llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` for its interleaved
  RoPE; we undo that permutation (rows only, so quantized blocks move intact) and use
  the HF "rotate half" RoPE.
- ``tokenizer.ggml.*`` (gpt2-style byte-level BPE) -> a ``tokenizer.json`` built with
  the ``tokenizers`` library, control tokens as special added tokens, plus the chat
  template -> ``tokenizer_config.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from uniun.models.convert.decoder_spec import BlockQuantized, DecoderConfig, Weight
from uniun.models.convert.hf_folder import tokenizer_config

_QK = 32  # values per Q4_1 / Q8_0 block
_LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
# llama.cpp pre-tokenizer names that are GPT-2 byte-level with single-digit splitting.
_DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "deepseek-coder", "qwen2", "llama3"}


class GgufError(ValueError):
    """The GGUF is not a model this converter understands; the message says why."""


@dataclass
class GgufModel:
    config: DecoderConfig
    weights: dict[str, Weight]
    tokenizer_json: str
    tokenizer_config: dict[str, Any]
    weight_format: str
    metadata: dict[str, Any]


def q4_1_to_nbits(raw: np.ndarray, rows: int, cols: int) -> BlockQuantized:
    """GGUF Q4_1 blocks (f16 d, f16 m, 16 bytes of nibbles) -> 4-bit MatMulNBits, exactly.

    GGUF stores value j of a block in the low nibble of byte j and value j+16 in the
    high nibble; MatMulNBits wants values 2i, 2i+1 in byte i. value = d*q + m
    = (q - 8) * d + (m + 8d): scale d, offset m + 8d (see :class:`BlockQuantized`).
    """
    blocks = raw.reshape(rows, cols // _QK, 20)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = blocks[..., 4:20]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [rows, nb, 32] in order
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return BlockQuantized(packed=packed, scales=d, offsets=m + 8.0 * d, bits=4,
                          block_size=_QK, shape=(rows, cols))


def q8_0_to_nbits(raw: np.ndarray, rows: int, cols: int) -> BlockQuantized:
    """GGUF Q8_0 blocks (f16 d, 32 int8) -> 8-bit MatMulNBits (code = q + 128), exactly."""
    blocks = raw.reshape(rows, cols // _QK, 34)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    q = blocks[..., 2:34].copy().view(np.int8)
    packed = (q.astype(np.int16) + 128).astype(np.uint8)
    return BlockQuantized(packed=packed, scales=d, offsets=None, bits=8,
                          block_size=_QK, shape=(rows, cols))


def _unpermute(weight: Weight, n_head: int) -> Weight:
    """Undo llama.cpp's Q/K row order (head, pair, 2) -> HF's (head, 2, pair)."""
    rows = weight.shape[0]
    half = rows // n_head // 2
    order = np.arange(rows).reshape(n_head, half, 2).transpose(0, 2, 1).reshape(rows)
    if isinstance(weight, BlockQuantized):
        return BlockQuantized(packed=weight.packed[order], scales=weight.scales[order],
                              offsets=(None if weight.offsets is None
                                       else weight.offsets[order]),
                              bits=weight.bits, block_size=weight.block_size,
                              shape=weight.shape)
    return weight[order]


def _tensor(t: Any) -> tuple[Weight, str]:
    """One GGUF tensor as a float array or BlockQuantized, and its type name."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    shape = [int(s) for s in reversed(t.shape)]  # GGUF lists dims fastest-first
    kind = Q(t.tensor_type)
    if kind == Q.F32:
        return np.asarray(t.data, np.float32).reshape(shape), kind.name
    if kind == Q.F16:
        return np.asarray(t.data).astype(np.float32).reshape(shape), kind.name
    if len(shape) == 2 and shape[1] % _QK == 0 and kind in (Q.Q4_1, Q.Q8_0):
        convert = q4_1_to_nbits if kind == Q.Q4_1 else q8_0_to_nbits
        return convert(np.asarray(t.data), shape[0], shape[1]), kind.name
    return dequantize(t.data, kind).astype(np.float32).reshape(shape), kind.name


def _field(reader: Any, name: str, default: Any = None) -> Any:
    f = reader.fields.get(name)
    return default if f is None else f.contents()


def read_config(reader: Any) -> DecoderConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise GgufError(f"architecture {arch!r} is not supported (only 'llama')")
    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    return DecoderConfig(
        num_hidden_layers=int(_field(reader, "llama.block_count")),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, "llama.rope.dimension_count", hidden // heads)),
        vocab_size=int(_field(reader, "llama.vocab_size", len(tokens))),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        max_position_embeddings=int(_field(reader, "llama.context_length", 2048)),
        tie_word_embeddings=not has_output,
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id", 1)),
        eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id", 2)),
    )


def read_weights(reader: Any, config: DecoderConfig,
                 progress: Callable[[int], None] | None = None) -> tuple[dict[str, Weight], str]:
    """HF-named weights; the second value names the tensor types found, e.g. 'Q4_1+Q8_0'."""
    weights: dict[str, Weight] = {}
    kinds: set[str] = set()
    for t in reader.tensors:
        value, kind = _tensor(t)
        if getattr(value, "ndim", 2) == 2:  # norms are always F32; name the matrices
            kinds.add(kind)
        if t.name in _GLOBAL_NAMES:
            name = _GLOBAL_NAMES[t.name]
        else:
            parts = t.name.split(".")
            if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _LAYER_NAMES:
                raise GgufError(f"unexpected tensor {t.name!r} for a llama model")
            name = f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.weight"
            if parts[2] == "attn_q":
                value = _unpermute(value, config.num_attention_heads)
            elif parts[2] == "attn_k":
                value = _unpermute(value, config.num_key_value_heads)
        weights[name] = value
        if progress:
            progress(1)
    return weights, "+".join(sorted(kinds))


def read_tokenizer(reader: Any) -> tuple[str, dict[str, Any]]:
    """``tokenizer.json`` text and ``tokenizer_config.json`` dict from the metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise GgufError(f"tokenizer model {kind!r} is not supported (only gpt2 byte-level BPE)")
    tokens: list[str] = list(_field(reader, "tokenizer.ggml.tokens"))
    types: list[int] = list(_field(reader, "tokenizer.ggml.token_type"))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                  byte_level])
                         if pre in _DIGIT_SPLIT_PRE else byte_level)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    control = [t for t, ty in zip(tokens, types) if ty in (3, 4)]  # CONTROL, USER_DEFINED
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])

    def name(key: str) -> str | None:
        idx = _field(reader, f"tokenizer.ggml.{key}_token_id")
        return None if idx is None else tokens[int(idx)]

    template = _field(reader, "tokenizer.chat_template")
    if not template:
        raise GgufError("the GGUF has no tokenizer.chat_template")
    bos, eos = name("bos"), name("eos")
    cfg = tokenizer_config(
        bos, eos, template, pad=name("padding"), unk=name("unknown"),
        additional=[t for t in control if t not in (bos, eos)],
        add_bos=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        max_length=int(_field(reader, "llama.context_length", 2048)))
    return tok.to_str(), cfg


def read_gguf(path: Path, progress: Callable[[int], None] | None = None) -> GgufModel:
    """Everything the store needs from one GGUF file (weights stay memory-mapped/blocked)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    config = read_config(reader)
    weights, fmt = read_weights(reader, config, progress)
    tokenizer_json, tok_cfg = read_tokenizer(reader)
    meta = {k: _field(reader, k) for k in ("general.name", "general.organization",
                                            "general.size_label", "general.file_type")}
    return GgufModel(config=config, weights=weights, tokenizer_json=tokenizer_json,
                     tokenizer_config=tok_cfg, weight_format=fmt, metadata=meta)


def tensor_count(path: Path) -> int:
    import gguf

    return len(gguf.GGUFReader(str(path)).tensors)


def convert_gguf(gguf_path: Path, folder: Path, *, progress: bool = True) -> str:
    """Convert a llama GGUF into a model folder (graph + HF side files); its weight format.

    Two bars: reading/repacking tensors, then building layers; saving is one write of
    the external data file.
    """
    from tqdm import tqdm

    from uniun.models.convert.hf_folder import write_hf_files
    from uniun.models.convert.onnx_decoder import build_decoder, save_decoder

    with tqdm(total=tensor_count(gguf_path), desc="read GGUF tensors", unit="tensor",
              disable=not progress) as bar:
        model = read_gguf(gguf_path, progress=bar.update)
    with tqdm(total=model.config.num_hidden_layers, desc="build ONNX layers", unit="layer",
              disable=not progress) as bar:
        graph = build_decoder(model.config, model.weights, progress=bar.update)
    save_decoder(graph, folder, external=True)
    write_hf_files(folder, model.config, model.tokenizer_json, model.tokenizer_config)
    return f"gguf-{model.weight_format.lower()}-nbits"
