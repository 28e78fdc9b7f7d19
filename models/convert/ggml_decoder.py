"""The decoder graph in llama.cpp's arithmetic: the same tokens as llama.cpp, bit for bit.

Why a second spelling of the decoder: a 135M model with 4-bit weights and 8-bit
activations amplifies a last-bit difference into a flipped activation code, and greedy
text then drifts; llama.cpp's own text drifts that way within a few dozen tokens when
nothing but its flash-attention or batch setting changes (docs/models.md).
So "close to llama.cpp" cannot give a user llama.cpp's text for llama.cpp's file; doing
each float operation in llama.cpp's order can. This graph is made of our operators that
do exactly that (``models/ggml_ops.c``, ``models/ggml_ort.c``, QMatMul with ``ggml=1``),
following llama.cpp's ``llm_build_llama`` with its defaults (no flash attention, an fp16
KV cache), as its CPU backend runs it when built for AVX-512:

- RMSNorm, then the norm weight (``GgmlRmsNorm``);
- fused Q/K/V, fused gate/up, O and down projections (``QMatMul`` in ggml's summation
  order; the residual is added after the dot product, as ``ggml_add`` does);
- RoPE on Q and K rows kept in the GGUF's order (``GgmlRope``, interleaved pairs);
- attention over an fp16 KV cache with ggml's fp16 dot products and softmax
  (``GgmlAttention``), the scale applied to the scores, not folded into Q;
- SwiGLU with ggml's vector exp (``GgmlSwiGlu``); the head on the 8-bit tied embedding.

It applies to Llama-family models whose matrices are Q4_1 or Q8_0 (the formats ggml's x86
build does not repack) and whose embedding is Q8_0 or float: :func:`ggml_unsupported`
says why not otherwise, and the builder then uses the usual graph.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from uniun.models.convert.decoder_blocks import GraphBuilder, last_position
from uniun.models.convert.decoder_spec import BlockQuantized, DecoderConfig, Progress, Weight
from uniun.models.convert.qmatmul_pack import format_of

__all__ = ["ggml_unsupported", "ggml_layers", "llama_cpp_rows", "GGML_FORMATS"]

GGML_FORMATS = ("q4_1", "q8_0")  # QMatMul's formats with ggml=1 (qmatmul_format.c)


def _linear_names(cfg: DecoderConfig, weights: Mapping[str, Weight]) -> list[str]:
    names = [f"model.layers.{i}.{part}.weight" for i in range(cfg.num_hidden_layers)
             for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                          "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
    head = "lm_head.weight" if "lm_head.weight" in weights else "model.embed_tokens.weight"
    return [*names, head]


def ggml_unsupported(cfg: DecoderConfig, weights: Mapping[str, Weight]) -> str | None:
    """Why this model cannot be built in llama.cpp's arithmetic, or None if it can."""
    if cfg.model_type != "llama" or cfg.hidden_act != "silu":
        return f"a {cfg.model_type} model ({cfg.hidden_act}); the ggml graph is Llama's"
    if (cfg.qk_norm or cfg.sandwich_norms or cfg.sliding_window or cfg.rope_freq_factors
            or cfg.embedding_scale != 1.0 or cfg.query_pre_attn_scalar is not None):
        return "the model uses features the ggml graph does not spell"
    if cfg.head_dim % 16:
        return f"head_dim {cfg.head_dim} is not a multiple of 16"
    if any(f"model.layers.{i}.self_attn.{x}_proj.bias" in weights
           for i in range(cfg.num_hidden_layers) for x in "qkv"):
        return "the model has attention biases"
    for name in _linear_names(cfg, weights):
        w = weights[name]
        fmt = format_of(w) if isinstance(w, BlockQuantized) else "float"
        if fmt not in GGML_FORMATS:
            return f"{name} is {fmt}; the ggml graph takes {' and '.join(GGML_FORMATS)}"
    embed = weights["model.embed_tokens.weight"]
    if isinstance(embed, BlockQuantized) and (embed.bits != 8 or embed.offsets is not None):
        return "the embedding is not 8-bit blocks or float"
    return None


def llama_cpp_rows(weight: Weight, n_head: int) -> Weight:
    """Q/K rows in llama.cpp's order (head, pair, 2) from HF's (head, 2, pair): what
    ``convert_hf_to_gguf`` writes, so that interleaved RoPE pairs are adjacent rows and
    a head's dot products run over its values in llama.cpp's order."""
    rows = weight.shape[0]
    half = rows // n_head // 2
    # llama.cpp's permute: row (head, pair, j) holds HF row (head, j, pair)
    order = np.arange(rows).reshape(n_head, 2, half).transpose(0, 2, 1).reshape(rows)
    if isinstance(weight, BlockQuantized):
        return BlockQuantized(packed=weight.packed[order], scales=weight.scales[order],
                              offsets=None if weight.offsets is None else weight.offsets[order],
                              bits=weight.bits, block_size=weight.block_size,
                              shape=weight.shape)
    return np.asarray(weight)[order]


def ggml_layers(g: GraphBuilder, cfg: DecoderConfig, weights: Mapping[str, Weight],
                hidden: str, progress: Progress | None = None) -> str:
    """The layers and the final norm of the ggml graph; the last position's normed state.

    ``g`` writes QMatMul nodes with ``ggml=1`` (``GraphBuilder(ggml=True)``); ``hidden``
    is the embedding lookup.
    """
    from uniun.models import qmatmul

    dom = qmatmul.DOMAIN
    eps = g.const("ggml.eps", np.array([cfg.rms_norm_eps], np.float32))
    base = g.const("ggml.rope_base", np.array([cfg.rope_theta], np.float32))
    scale = g.const("ggml.kq_scale", np.array(
        [np.float32(1.0) / np.sqrt(np.float32(cfg.head_dim))], np.float32))
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads

    def norm(x: str, name: str, hint: str) -> str:
        w = g.const(name, np.asarray(weights[name], np.float32))
        return g.op("GgmlRmsNorm", [x, w, eps], hint, domain=dom)[0]

    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        normed = norm(hidden, f"{p}.input_layernorm.weight", f"l{i}_ln1")
        q, k, v = g.linear(normed, [llama_cpp_rows(weights[f"{p}.self_attn.q_proj.weight"], heads),
                                    llama_cpp_rows(weights[f"{p}.self_attn.k_proj.weight"],
                                                   kv_heads),
                                    weights[f"{p}.self_attn.v_proj.weight"]],
                           f"{p}.self_attn.qkv_proj")
        q = g.op("GgmlRope", [q, "position_ids", base], f"l{i}_qrot", domain=dom,
                 num_heads=heads, interleaved=1)[0]
        k = g.op("GgmlRope", [k, "position_ids", base], f"l{i}_krot", domain=dom,
                 num_heads=kv_heads, interleaved=1)[0]
        attn = g.op("GgmlAttention", [q, k, v, f"past_key_values.{i}.key",
                                      f"past_key_values.{i}.value", "attention_mask", scale],
                    f"l{i}_attn", domain=dom, num_heads=heads, kv_num_heads=kv_heads,
                    out_names=[g.name(f"l{i}_attn_out"), f"present.{i}.key",
                               f"present.{i}.value"])[0]
        hidden = g.linear(attn, [weights[f"{p}.self_attn.o_proj.weight"]],
                          f"{p}.self_attn.o_proj", residual=hidden)[0]
        normed = norm(hidden, f"{p}.post_attention_layernorm.weight", f"l{i}_ln2")
        gate, up = g.linear(normed, [weights[f"{p}.mlp.gate_proj.weight"],
                                     weights[f"{p}.mlp.up_proj.weight"]], f"{p}.mlp.gate_up_proj")
        gated = g.op("GgmlSwiGlu", [gate, up], f"l{i}_swiglu", domain=dom)[0]
        hidden = g.linear(gated, [weights[f"{p}.mlp.down_proj.weight"]], f"{p}.mlp.down_proj",
                          residual=hidden)[0]
        if progress:
            progress(1)
    return norm(last_position(g, hidden), "model.norm.weight", "final_norm")
