"""Per-architecture reading of a GGUF: metadata -> DecoderConfig, tensor names -> HF names.

Three families, each a small table rather than a class, because they differ in a few
facts only (docs/models.md "GGUF import"):

- **llama** (SmolLM2, TinyLlama, Llama 3.x): llama.cpp's converter permutes the rows of
  ``attn_q`` / ``attn_k`` for its interleaved RoPE; we undo it (rows only, so quantized
  blocks move intact) and use HF's rotate-half RoPE. Llama 3.x's ``rope_freqs.weight``
  becomes ``rope_freq_factors``.
- **qwen2**: no permutation (NEOX RoPE), Q/K/V biases (``attn_q.bias`` ...).
- **gemma3**: no permutation; QK norm, the sandwich norms around attention and MLP,
  tanh-GELU, embeddings scaled by sqrt(hidden), 5 sliding-window layers (window
  ``gemma3.attention.sliding_window``, RoPE base 10000) per global one (RoPE base
  ``freq_base``), as llama.cpp hard-codes them. llama.cpp's converter already stored
  Gemma's RMSNorm weights as ``1 + w``, so the plain RMSNorm is the right op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from uniun.models.convert.decoder_spec import BlockQuantized, DecoderConfig, Weight
from uniun.models.store import ModelStoreError

__all__ = ["FAMILIES", "Family", "GgufError", "field", "hf_name", "read_config", "unpermute"]


class GgufError(ModelStoreError, ValueError):
    """The GGUF is not a model this converter understands; the message says why."""


@dataclass(frozen=True)
class Family:
    """What differs between the supported architectures."""

    layer_names: dict[str, str]  # GGUF per-layer tensor stem -> HF module name
    permute_qk: bool  # llama.cpp's row permutation of attn_q / attn_k to undo


_COMMON = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
           "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
           "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
           "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
FAMILIES: dict[str, Family] = {
    "llama": Family({**_COMMON, "ffn_norm": "post_attention_layernorm"}, permute_qk=True),
    "qwen2": Family({**_COMMON, "ffn_norm": "post_attention_layernorm"}, permute_qk=False),
    "gemma3": Family({**_COMMON, "ffn_norm": "pre_feedforward_layernorm",
                      "post_attention_norm": "post_attention_layernorm",
                      "post_ffw_norm": "post_feedforward_layernorm",
                      "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
                     permute_qk=False),
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_GEMMA3_LOCAL_ROPE_BASE = 10000.0  # llama.cpp's rope_freq_base_train_swa for gemma3
_GEMMA3_SWA_PATTERN = 6


def field(reader: Any, name: str, default: Any = None) -> Any:
    """The value of metadata field ``name`` (``default`` if absent); a value that cannot
    be decoded (a string that is not UTF-8, a damaged array) is a GgufError naming it."""
    f = reader.fields.get(name)
    if f is None:
        return default
    try:
        return f.contents()
    except (UnicodeDecodeError, ValueError, IndexError, TypeError) as exc:
        raise GgufError(f"metadata field {name} cannot be read ({type(exc).__name__}: "
                        f"{str(exc)[:120]})") from None


def architecture(reader: Any) -> str:
    arch = field(reader, "general.architecture")
    if not isinstance(arch, str) or arch not in FAMILIES:
        raise GgufError(f"architecture {arch!r} is not supported "
                        f"(supported: {', '.join(FAMILIES)})")
    return str(arch)


def read_config(reader: Any) -> DecoderConfig:
    """The :class:`DecoderConfig` of a llama / qwen2 / gemma3 GGUF."""
    arch = architecture(reader)

    def key(name: str, default: Any = None) -> Any:
        return field(reader, f"{arch}.{name}", default)

    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    tokens = field(reader, "tokenizer.ggml.tokens") or []
    names = {t.name for t in reader.tensors}
    head_dim = int(key("attention.key_length", key("rope.dimension_count", hidden // heads)))
    extra: dict[str, Any] = {"model_type": arch}
    if "rope_freqs.weight" in names:
        freqs = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
        extra["rope_freq_factors"] = tuple(float(x) for x in np.asarray(freqs.data).ravel())
    if arch == "gemma3":
        extra.update(hidden_act="gelu_pytorch_tanh", embedding_scale=float(hidden) ** 0.5,
                     sandwich_norms=True, qk_norm=True,
                     sliding_window=int(key("attention.sliding_window", 512)),
                     sliding_window_pattern=_GEMMA3_SWA_PATTERN,
                     rope_local_base_freq=_GEMMA3_LOCAL_ROPE_BASE)
    return DecoderConfig(
        num_hidden_layers=int(key("block_count")),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_attention_heads=heads,
        num_key_value_heads=int(key("attention.head_count_kv", heads)),
        head_dim=head_dim,
        vocab_size=int(key("vocab_size", len(tokens))),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        max_position_embeddings=int(key("context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=int(field(reader, "tokenizer.ggml.bos_token_id", 1)),
        eos_token_id=int(field(reader, "tokenizer.ggml.eos_token_id", 2)),
        **extra,
    )


def hf_name(arch: str, gguf_name: str) -> str | None:
    """The HF name of a GGUF tensor; None for tensors the graph does not use."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name == "rope_freqs.weight":
        return None  # read into the config
    parts = gguf_name.split(".")
    stems = FAMILIES[arch].layer_names
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in stems \
            or parts[3] not in ("weight", "bias"):
        raise GgufError(f"unexpected tensor {gguf_name!r} for a {arch} model")
    return f"model.layers.{parts[1]}.{stems[parts[2]]}.{parts[3]}"


def unpermute(weight: Weight, n_head: int) -> Weight:
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
