"""Refusing a GGUF whose numbers do not describe a model, before any work is done.

A GGUF is a header of metadata and tensor descriptions followed by the tensor bytes;
every number in it comes from whoever wrote the file. Left unchecked, a missing head
count is a ``TypeError`` deep in the config, a zero one a ``ZeroDivisionError``, an
absurd layer count a build that never ends, a tensor whose bytes lie past the end of the
file a numpy reshape error. Here each of those is a :class:`GgufError` that names the
field or the tensor (docs/models.md, "GGUF import"):

- :func:`checked_reader`: the ``gguf`` package's reader, with every tensor description
  checked before its data is mapped: a known type, no zero dimension, bytes that end
  inside the file and overlap no other tensor's.
- :func:`field_problems`: the architecture's numbers are present, integers where they
  must be, within :data:`LIMITS`, and consistent (heads divide into KV groups, the head
  size is even for RoPE, token ids inside the vocabulary).
- :func:`tensor_problems`: every tensor the graph needs is there with the shape the
  numbers imply, and no layer beyond ``block_count``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

from uniun.models.convert.gguf_families import GgufError, field

__all__ = ["LIMITS", "checked_reader", "field_problems", "tensor_problems"]

# Architecture keys (after "<arch>.") that must be integers in [low, high]. The highs are
# far above any model this runtime could load; they exist so that a corrupt or hostile
# header cannot make the converter loop or allocate without end.
LIMITS: dict[str, tuple[int, int]] = {
    "block_count": (1, 1024),
    "embedding_length": (1, 1 << 16),
    "feed_forward_length": (1, 1 << 18),
    "attention.head_count": (1, 1024),
    "attention.head_count_kv": (1, 1024),
    "attention.key_length": (2, 4096),
    "attention.value_length": (2, 4096),
    "rope.dimension_count": (2, 4096),
    "context_length": (1, 1 << 24),
    "vocab_size": (1, 1 << 22),
    "attention.sliding_window": (1, 1 << 24),
}
REQUIRED = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")
MAX_ELEMENTS = 1 << 40  # elements of one tensor; a larger product is a corrupt header


_READER_CLASS: list[type] = []  # the subclass, made on first use (gguf imports lazily)


def checked_reader(path: str) -> Any:
    """``gguf.GGUFReader(path)`` that refuses a bad tensor description by name.

    The check runs inside the reader's own ``_build_tensors``, on the descriptions it
    parsed, before it maps any data: a file that fails never reaches numpy's reshape.
    """
    if not _READER_CLASS:
        import gguf

        class CheckedReader(gguf.GGUFReader):
            def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
                spans = sorted(_check_tensor(desc, int(start_offs), len(self.data))
                               for desc in fields)
                for (_, end, name), (start, _, other) in itertools.pairwise(spans):
                    if start < end:
                        raise GgufError(f"tensors {name!r} and {other!r} overlap in the file; "
                                        "the header is corrupt")
                super()._build_tensors(start_offs, fields)

        _READER_CLASS.append(CheckedReader)
    return _READER_CLASS[0](path)


def _check_tensor(desc: Any, data_start: int, file_size: int) -> tuple[int, int, str]:
    """(start, end, name) of a sound tensor description; GgufError naming it otherwise."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    _len, name_data, _n_dims, dims, raw_dtype, offset = desc.parts
    name = bytes(name_data).decode("utf-8", errors="replace")
    try:
        kind = GGMLQuantizationType(int(raw_dtype[0]))
    except ValueError:
        raise GgufError(f"tensor {name!r} has an unknown type number {int(raw_dtype[0])}"
                        ) from None
    shape = [int(d) for d in dims]
    if not shape or any(d <= 0 for d in shape):
        raise GgufError(f"tensor {name!r} has a zero or missing dimension (shape {shape})")
    elements = math.prod(shape)
    if elements > MAX_ELEMENTS:
        raise GgufError(f"tensor {name!r} claims {elements} elements (shape {shape}); "
                        "the header is corrupt")
    if kind not in GGML_QUANT_SIZES:
        raise GgufError(f"tensor {name!r} has type {kind.name}, which has no known size")
    block, type_size = GGML_QUANT_SIZES[kind]
    if shape[0] % block:
        raise GgufError(f"tensor {name!r}: rows of {shape[0]} values do not fill whole "
                        f"{kind.name} blocks of {block}")
    start = data_start + int(offset[0])
    end = start + elements // block * type_size
    if end > file_size:
        raise GgufError(f"tensor {name!r}: its data would end at byte {end}, past the end "
                        f"of the file ({file_size} bytes); the file is truncated or corrupt")
    return start, end, name


def _int_field(reader: Any, key: str) -> tuple[int | None, str | None]:
    """(value, problem) of an integer field; (None, None) when absent."""
    value = field(reader, key)
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, int):
        return None, f"{key} must be an integer (got {value!r:.40})"
    return value, None


def _number_problem(reader: Any, key: str, low: float, high: float) -> str | None:
    value = field(reader, key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or not low < value <= high:
        return f"{key} must be a number in ({low:g}, {high:g}] (got {value!r:.40})"
    return None


def field_problems(reader: Any, arch: str) -> list[str]:
    """Every problem with the architecture's numbers, each naming its field."""
    problems: list[str] = []
    values: dict[str, int] = {}
    for name, (low, high) in LIMITS.items():
        key = f"{arch}.{name}"
        value, problem = _int_field(reader, key)
        if problem:
            problems.append(problem)
        elif value is None:
            if name in REQUIRED:
                problems.append(f"{key} is missing")
        elif not low <= value <= high:
            problems.append(f"{key} is {value}; must be {low}..{high}")
        else:
            values[name] = value
    for key, floor, ceiling in ((f"{arch}.attention.layer_norm_rms_epsilon", 0.0, 1.0),
                                (f"{arch}.rope.freq_base", 0.0, 1e12)):
        if (problem := _number_problem(reader, key, floor, ceiling)) is not None:
            problems.append(problem)
    if problems:
        return problems
    heads = values["attention.head_count"]
    kv = values.get("attention.head_count_kv", heads)
    hidden = values["embedding_length"]
    if heads % kv:
        problems.append(f"{arch}.attention.head_count {heads} is not a multiple of "
                        f"{arch}.attention.head_count_kv {kv}")
    head_dim = values.get("attention.key_length", values.get("rope.dimension_count"))
    if head_dim is None:
        if hidden % heads:
            problems.append(f"{arch}.embedding_length {hidden} is not a multiple of "
                            f"{arch}.attention.head_count {heads} (and no key_length)")
        head_dim = hidden // heads
    if head_dim % 2:
        problems.append(f"the head size {head_dim} ({arch}.attention.key_length or "
                        "rope.dimension_count) must be even for rotary positions")
    value_dim = values.get("attention.value_length", head_dim)
    if value_dim != head_dim:
        problems.append(f"{arch}.attention.value_length {value_dim} differs from the key "
                        f"length {head_dim}; not supported")
    rope = values.get("rope.dimension_count", head_dim)
    if rope > head_dim:
        problems.append(f"{arch}.rope.dimension_count {rope} exceeds the head size "
                        f"{head_dim}")
    tokens = field(reader, "tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        problems.append("tokenizer.ggml.tokens is missing or empty")
        return problems
    vocab = values.get("vocab_size", len(tokens))
    if len(tokens) > vocab:
        problems.append(f"tokenizer.ggml.tokens has {len(tokens)} tokens, more than "
                        f"{arch}.vocab_size {vocab}")
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        value, problem = _int_field(reader, key)
        if problem:
            problems.append(problem)
        elif value is not None and not 0 <= value < len(tokens):
            problems.append(f"{key} is {value}; the vocabulary has {len(tokens)} tokens")
    return problems


def _expected(arch: str, c: Any) -> Iterator[tuple[str, tuple[int, ...], bool]]:
    """(GGUF name, shape in HF order [out, in], required) of every tensor the graph reads."""
    q, kv, hd, h, ff = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim,
                        c.head_dim, c.hidden_size, c.intermediate_size)
    yield "token_embd.weight", (c.vocab_size, h), True
    yield "output_norm.weight", (h,), True
    yield "output.weight", (c.vocab_size, h), False
    for i in range(c.num_hidden_layers):
        p = f"blk.{i}"
        yield from ((f"{p}.attn_norm.weight", (h,), True), (f"{p}.attn_q.weight", (q, h), True),
                    (f"{p}.attn_k.weight", (kv, h), True), (f"{p}.attn_v.weight", (kv, h), True),
                    (f"{p}.attn_output.weight", (h, q), True), (f"{p}.ffn_norm.weight", (h,), True),
                    (f"{p}.ffn_gate.weight", (ff, h), True), (f"{p}.ffn_up.weight", (ff, h), True),
                    (f"{p}.ffn_down.weight", (h, ff), True))
        if arch == "qwen2":
            yield from ((f"{p}.attn_q.bias", (q,), False), (f"{p}.attn_k.bias", (kv,), False),
                        (f"{p}.attn_v.bias", (kv,), False))
        if arch == "gemma3":
            yield from ((f"{p}.attn_q_norm.weight", (hd,), True),
                        (f"{p}.attn_k_norm.weight", (hd,), True),
                        (f"{p}.post_attention_norm.weight", (h,), True),
                        (f"{p}.post_ffw_norm.weight", (h,), True))


def tensor_problems(reader: Any, arch: str, config: Any) -> list[str]:
    """Missing tensors, tensors of the wrong shape, and layers past ``block_count``."""
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}
    problems: list[str] = []
    missing: list[str] = []
    for name, want, required in _expected(arch, config):
        got = shapes.get(name)
        if got is None:
            if required:
                missing.append(name)
        elif got != want:
            problems.append(f"tensor {name!r} has shape {list(got)}, but the metadata "
                            f"({arch}.embedding_length, head counts, key_length, "
                            f"feed_forward_length, vocabulary) implies {list(want)}")
    if missing:
        problems.insert(0, f"{len(missing)} tensor(s) missing, e.g. {', '.join(missing[:3])} "
                           f"({arch}.block_count is {config.num_hidden_layers})")
    beyond = sorted({n.split(".")[1] for n in shapes if n.startswith("blk.")
                     and (not n.split(".")[1].isdigit()
                          or int(n.split(".")[1]) >= config.num_hidden_layers)})
    if beyond:
        problems.append(f"tensors of layer(s) {', '.join(beyond[:5])} exist, but "
                        f"{arch}.block_count is {config.num_hidden_layers}")
    freqs = shapes.get("rope_freqs.weight")
    if freqs is not None and freqs != (config.head_dim // 2,):
        problems.append(f"tensor 'rope_freqs.weight' has shape {list(freqs)}; the head size "
                        f"{config.head_dim} implies [{config.head_dim // 2}]")
    return problems
