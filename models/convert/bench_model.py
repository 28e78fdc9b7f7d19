"""Bench models: llama GGUFs with the real shapes of Llama 3.2 1B / 3B and random weights.

Why: every engine figure was taken on SmolLM2-135M, while the product's target is a
3B-class model on a laptop, and the weights of such a model cannot be downloaded here.
A decoder's speed and memory depend on its shapes and weight format, not on what its
weights say, so a file with Llama 3.2's tensor shapes (hidden size, layers, heads,
KV heads, head size, MLP width, vocabulary, RoPE base and Llama 3 frequency scaling,
tied embeddings) and random weights costs what the real model costs in both engines.

How the file is made (docs/models.md, "Bench models"):

- **Weights are random blocks, written directly.** Each matrix row is a run of blocks
  whose codes are uniform random and whose scale gives the row the spread of a
  ``1/sqrt(fan_in)`` initialisation (the output and down projections further divided by
  ``sqrt(2 * layers)``), so the residual stream stays near unit size through every
  layer: activations stay finite and the picked tokens vary. Nothing is held beyond one
  chunk of rows (the 3B file is ~2 GB), and no float matrix is ever quantized, which
  keeps a 3B file to a minute of writing.
- **Formats.** ``Q4_1``: the matrices in Q4_1 and the tied embedding in Q8_0, as in
  SmolLM2's Q4_1 file (the default model's); ``Q8_0``: everything in Q8_0. Other formats
  come from llama.cpp's own quantizer applied to the Q8_0 file
  (``uniun.runtime.bench.peer_quantize``).
- **Tokenizer.** SmolLM2's (byte-level BPE, 49,152 tokens, its chat template), copied
  from its GGUF. Llama 3.2's vocabulary is 128,256, and the embedding keeps that real
  size; ids from 49,152 up are *filler tokens*: plain vocabulary entries spelled
  ``<fill-N>`` (N = the id), which no merge produces, so encoding never yields one,
  while every id the model can pick decodes to text (in our tokenizer and llama.cpp's).
  Their embedding rows have half the spread of the others, so greedy picks are mostly
  SmolLM2 tokens and generated text reads as words, not filler.
- **Deterministic.** Every chunk's random numbers come from ``(seed, tensor, chunk)``,
  so a shape, format and seed always give the same bytes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["SHAPES", "FORMATS", "BenchShape", "bench_model_id", "bench_file_name",
           "write_bench_gguf", "FILLER_PREFIX"]

FORMATS = ("Q4_1", "Q8_0")  # written directly; others by llama.cpp's quantizer
FILLER_PREFIX = "<fill-"
FILLER_SPREAD = 0.5  # filler embedding rows' spread, relative to the others
CHUNK_BYTES = 32 << 20  # bytes of blocks generated and written at a time
DEFAULT_SEED = 0


@dataclass(frozen=True)
class BenchShape:
    """The numbers of one llama-architecture model (all that its cost depends on)."""

    name: str  # CLI name: "1b", "3b"
    label: str  # what it has the shape of
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float = 500_000.0
    context: int = 131_072
    rms_eps: float = 1e-5
    # Llama 3's RoPE frequency scaling (rope_scaling in its config.json)
    rope_factor: float = 32.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_context: int = 8192

    def matrices(self) -> list[tuple[str, int, int]]:
        """(GGUF name, rows, columns) of every per-layer matrix, in file order."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        out = []
        for i in range(self.layers):
            out += [(f"blk.{i}.attn_q.weight", q, self.hidden),
                    (f"blk.{i}.attn_k.weight", kv, self.hidden),
                    (f"blk.{i}.attn_v.weight", kv, self.hidden),
                    (f"blk.{i}.attn_output.weight", self.hidden, q),
                    (f"blk.{i}.ffn_gate.weight", self.ffn, self.hidden),
                    (f"blk.{i}.ffn_up.weight", self.ffn, self.hidden),
                    (f"blk.{i}.ffn_down.weight", self.hidden, self.ffn)]
        return out

    def rope_freq_factors(self) -> np.ndarray:
        """llama.cpp's ``rope_freqs.weight`` for Llama 3 scaling (its converter's formula)."""
        freqs = 1.0 / (self.rope_theta ** (np.arange(0, self.head_dim, 2) / self.head_dim))
        low_wavelen = self.rope_original_context / self.rope_low_freq_factor
        high_wavelen = self.rope_original_context / self.rope_high_freq_factor
        factors = []
        for freq in freqs:
            wavelen = 2 * math.pi / freq
            if wavelen < high_wavelen:
                factors.append(1.0)
            elif wavelen > low_wavelen:
                factors.append(self.rope_factor)
            else:
                smooth = ((self.rope_original_context / wavelen - self.rope_low_freq_factor)
                          / (self.rope_high_freq_factor - self.rope_low_freq_factor))
                factors.append(1.0 / ((1 - smooth) / self.rope_factor + smooth))
        return np.asarray(factors, np.float32)


# Llama 3.2's config.json numbers (meta-llama/Llama-3.2-1B and -3B).
SHAPES: dict[str, BenchShape] = {
    "1b": BenchShape("1b", "Llama 3.2 1B", hidden=2048, layers=16, heads=32, kv_heads=8,
                     head_dim=64, ffn=8192, vocab=128_256),
    "3b": BenchShape("3b", "Llama 3.2 3B", hidden=3072, layers=28, heads=24, kv_heads=8,
                     head_dim=128, ffn=8192, vocab=128_256),
}


def bench_model_id(shape: str, fmt: str, seed: int = DEFAULT_SEED) -> str:
    """``bench-llama-1b-q4_1`` (``-seed7`` appended for a seed other than the default)."""
    suffix = "" if seed == DEFAULT_SEED else f"-seed{seed}"
    return f"bench-llama-{shape}-{fmt.lower()}{suffix}"


def bench_file_name(shape: str, fmt: str, seed: int = DEFAULT_SEED) -> str:
    return f"{bench_model_id(shape, fmt, seed)}.gguf"


def _block_kind(fmt: str, name: str) -> str:
    return "Q8_0" if fmt == "Q8_0" or name == "token_embd.weight" else fmt


def _row_bytes(kind: str, cols: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    return cols // block * size


def _blocks(kind: str, rng: np.random.Generator, n: int, spread: np.ndarray) -> np.ndarray:
    """``n`` random blocks of ``kind`` as bytes [n, block bytes]; ``spread`` [n]: the
    standard deviation each block's values should have."""
    if kind == "Q4_1":  # d (f16), m (f16), 16 bytes of 4-bit codes: value = d q + m
        d = (spread * math.sqrt(12) / 16).astype(np.float16)
        m = (-7.5 * d.astype(np.float32)).astype(np.float16)  # centred codes
        codes = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
        return np.concatenate([d.view(np.uint8).reshape(n, 2), m.view(np.uint8).reshape(n, 2),
                               codes], axis=1)
    if kind == "Q8_0":  # d (f16), 32 int8 codes: value = d q
        d = (spread * math.sqrt(3) / 127).astype(np.float16)
        codes = rng.integers(-127, 128, size=(n, 32), dtype=np.int8).view(np.uint8)
        return np.concatenate([d.view(np.uint8).reshape(n, 2), codes], axis=1)
    raise ValueError(f"cannot write {kind} blocks (written directly: {', '.join(FORMATS)})")


@dataclass(frozen=True)
class _Tensor:
    name: str
    rows: int
    cols: int
    kind: str  # "F32" or a block type
    std: float  # the values' spread (matrices)
    filler_from: int | None = None  # rows from here get FILLER_SPREAD x std


def _tensors(shape: BenchShape, fmt: str) -> list[_Tensor]:
    """Every tensor, in the order llama.cpp's converter writes a Llama 3.2 file."""
    residual = 1 / math.sqrt(2 * shape.layers)  # per-layer output projections
    out = [_Tensor("rope_freqs.weight", 1, shape.head_dim // 2, "F32", 0.0),
           _Tensor("token_embd.weight", shape.vocab, shape.hidden,
                   _block_kind(fmt, "token_embd.weight"), 1 / math.sqrt(shape.hidden),
                   filler_from=None)]
    for i in range(shape.layers):
        out.append(_Tensor(f"blk.{i}.attn_norm.weight", 1, shape.hidden, "F32", 0.0))
        out.append(_Tensor(f"blk.{i}.ffn_norm.weight", 1, shape.hidden, "F32", 0.0))
        for name, rows, cols in shape.matrices()[7 * i:7 * i + 7]:
            scale = residual if ("attn_output" in name or "ffn_down" in name) else 1.0
            out.append(_Tensor(name, rows, cols, _block_kind(fmt, name),
                               scale / math.sqrt(cols)))
    out.append(_Tensor("output_norm.weight", 1, shape.hidden, "F32", 0.0))
    return out


def _tokenizer_fields(tokenizer_gguf: Path, vocab: int
                      ) -> tuple[list[tuple[str, Any, Any, Any]], int]:
    """(key, value, type, sub-type) of the source's tokenizer, padded to ``vocab`` ids, and
    how many tokens it had (the first filler id)."""
    import gguf

    reader = gguf.GGUFReader(str(tokenizer_gguf))
    fields = []
    n_tokens = 0
    for key, f in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = f.contents()
        if key == "tokenizer.ggml.tokens":
            if len(value) > vocab:
                raise ValueError(f"{tokenizer_gguf} has {len(value)} tokens, more than the "
                                 f"{vocab} the shape has room for")
            n_tokens = len(value)
            value = list(value) + [f"{FILLER_PREFIX}{i}>" for i in range(len(value), vocab)]
        elif key == "tokenizer.ggml.token_type":
            value = list(value) + [int(gguf.TokenType.NORMAL)] * (vocab - len(value))
        elif key == "tokenizer.ggml.scores":
            value = list(value) + [0.0] * (vocab - len(value))
        fields.append((key, value, vtype, sub))
    if not n_tokens:
        raise ValueError(f"{tokenizer_gguf} has no tokenizer")
    return fields, n_tokens


def _metadata(writer: Any, shape: BenchShape, fmt: str, seed: int, title: str) -> None:
    import gguf

    arch = "llama"
    writer.add_string("general.type", "model")
    writer.add_string("general.name", title)
    writer.add_string("general.size_label", shape.name.upper())
    writer.add_string("general.description",
                      f"random weights (seed {seed}) with the tensor shapes of {shape.label}; "
                      "a benchmark file, not a language model")
    writer.add_uint32(f"{arch}.block_count", shape.layers)
    writer.add_uint32(f"{arch}.context_length", shape.context)
    writer.add_uint32(f"{arch}.embedding_length", shape.hidden)
    writer.add_uint32(f"{arch}.feed_forward_length", shape.ffn)
    writer.add_uint32(f"{arch}.attention.head_count", shape.heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", shape.kv_heads)
    writer.add_float32(f"{arch}.rope.freq_base", shape.rope_theta)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", shape.rms_eps)
    writer.add_uint32(f"{arch}.attention.key_length", shape.head_dim)
    writer.add_uint32(f"{arch}.attention.value_length", shape.head_dim)
    writer.add_uint32(f"{arch}.vocab_size", shape.vocab)
    writer.add_uint32(f"{arch}.rope.dimension_count", shape.head_dim)
    file_type = {"Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
    writer.add_uint32("general.file_type", int(file_type[fmt]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _chunks(t: _Tensor, rng_seed: tuple[int, int]) -> Iterator[bytes]:
    """The tensor's bytes, ``CHUNK_BYTES`` at a time."""
    if t.kind == "F32":
        if t.name == "rope_freqs.weight":
            raise AssertionError("rope_freqs is written by the caller")
        yield np.ones(t.cols, np.float32).tobytes()  # RMSNorm weights
        return
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block = GGML_QUANT_SIZES[GGMLQuantizationType[t.kind]][0]
    per_row = t.cols // block
    row_bytes = _row_bytes(t.kind, t.cols)
    rows_per_chunk = max(1, CHUNK_BYTES // row_bytes)
    for c, start in enumerate(range(0, t.rows, rows_per_chunk)):
        rows = min(rows_per_chunk, t.rows - start)
        rng = np.random.default_rng([*rng_seed, c])
        spread = np.full(rows, t.std, np.float32)
        if t.filler_from is not None:
            spread[max(0, t.filler_from - start):] *= FILLER_SPREAD
        yield _blocks(t.kind, rng, rows * per_row, np.repeat(spread, per_row)).tobytes()


def write_bench_gguf(path: Path, shape: BenchShape, fmt: str, *, seed: int = DEFAULT_SEED,
                     tokenizer_gguf: Path,
                     progress: Callable[[int], None] | None = None) -> int:
    """Write the bench model to ``path`` (through ``path.partial``, renamed when whole).

    ``progress(n)`` is called with the bytes of tensor data written since the last
    call; returns the file's size. Memory stays near one chunk (``CHUNK_BYTES``).
    """
    import gguf

    fmt = fmt.upper()
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not written directly (choose {', '.join(FORMATS)};"
                         " other formats are requantized from Q8_0 by llama.cpp)")
    tok_fields, n_tokens = _tokenizer_fields(tokenizer_gguf, shape.vocab)
    tensors = [t if t.name != "token_embd.weight" else
               _Tensor(t.name, t.rows, t.cols, t.kind, t.std, filler_from=n_tokens)
               for t in _tensors(shape, fmt)]
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), "llama")
    title = f"bench {shape.label} shape, {fmt}, seed {seed}"
    _metadata(writer, shape, fmt, seed, title)
    for key, value, vtype, sub in tok_fields:
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for t in tensors:
        if t.kind == "F32":
            writer.add_tensor_info(t.name, (t.cols,), np.dtype(np.float32), 4 * t.cols)
        else:
            nbytes = t.rows * _row_bytes(t.kind, t.cols)
            writer.add_tensor_info(t.name, (t.rows, _row_bytes(t.kind, t.cols)),
                                   np.dtype(np.uint8), nbytes,
                                   raw_dtype=gguf.GGMLQuantizationType[t.kind])
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None
        out = writer.fout[0]
        for index, t in enumerate(tensors):
            writer.write_padding(out, out.tell())
            written = 0
            parts = ([shape.rope_freq_factors().tobytes()] if t.name == "rope_freqs.weight"
                     else _chunks(t, (seed, index)))
            for part in parts:
                out.write(part)
                written += len(part)
                if progress:
                    progress(len(part))
            writer.write_padding(out, written)
        out.flush()
        os.fsync(out.fileno())
    except BaseException:
        writer.close()
        partial.unlink(missing_ok=True)
        raise
    writer.close()
    partial.replace(path)
    return path.stat().st_size


def data_bytes(shape: BenchShape, fmt: str) -> int:
    """Bytes of tensor data the file will hold (what the progress bar counts to)."""
    total = 0
    for t in _tensors(shape, fmt.upper()):
        total += 4 * t.cols if t.kind == "F32" else t.rows * _row_bytes(t.kind, t.cols)
    return total
