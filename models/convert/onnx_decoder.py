"""Build an ONNX graph for a Llama-style decoder from a weights dict and a config.

One builder serves every source (the tiny synthetic model, the GGUF conversion), so
every model in the store has the same graph shape and the same I/O contract, the one
optimum and onnxruntime-genai exports use (so imported folders look the same too):

- inputs: ``input_ids`` int64 [batch, seq]; ``attention_mask`` int64
  [batch, past_seq + seq]; ``position_ids`` int64 [batch, seq];
  ``past_key_values.{i}.key`` / ``.value`` float32 [batch, kv_heads, past_seq, head_dim]
- outputs: ``logits`` float32 [batch, 1, vocab] (the last position: nothing reads the
  others); ``present.{i}.key`` / ``.value`` float32 [batch, kv_heads, total, head_dim],
  where total is past_seq + seq, or past_seq itself when the caller feeds a preallocated
  buffer longer than what it holds (GroupQueryAttention's shared past/present buffer)

Theory of operation: the graph uses the opset-23 ``RMSNormalization`` and
``RotaryEmbedding`` (HF "rotate half" layout, position-id indexed cos/sin tables);
attention is spelled out as MatMul / Softmax / MatMul over the query heads grouped by
KV head (GQA, past/present KV, bottom-right causal alignment; ``attention_mask`` adds
a key mask so left padding works) so a position's result does not depend on how many
positions share its pass. A linear weight is either a float matrix (plain ``MatMul``)
or a :class:`~uniun.models.convert.decoder_spec.BlockQuantized` matrix
(``com.microsoft.MatMulNBits``), which lets a GGUF's Q4_1 / Q8_0 blocks run as they are
instead of being inflated to float32 — the choice that decodes fastest here (see
docs/models.md).

This module holds the layer loop, the I/O declarations and :func:`save_decoder`; the
types it consumes are in :mod:`~uniun.models.convert.decoder_spec`, and how each piece
(fused projections, the attention bias, attention itself) is spelled in ONNX nodes is in
:mod:`~uniun.models.convert.decoder_blocks`.

Weights use Hugging Face names (``model.layers.{i}.self_attn.q_proj.weight``, shape
[out, in]) so a reader can check them against any HF checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.external_data_helper import convert_model_to_external_data, set_external_data

from uniun.models import qmatmul
from uniun.models.convert.decoder_blocks import (
    MS_DOMAIN,
    QBLOCKS_SUFFIX,
    GraphBuilder,
    activation,
    add_bias,
    attention,
    attention_bias,
    gqa_attention,
    head_norm,
    kv_lengths,
    last_position,
    rope_tables,
    scale_rows,
    scaled,
)
from uniun.models.convert.decoder_spec import BlockQuantized, DecoderConfig, Progress, Weight
from uniun.models.convert.ggml_decoder import ggml_layers, ggml_unsupported
from uniun.models.convert.qmatmul_pack import packable

__all__ = ["build_decoder", "save_decoder", "BUILDER_VERSION", "OPSET", "EXTERNAL_DATA_NAME"]

OPSET = 23
# Bump whenever the graph this module writes changes: the store rebuilds the models it
# made with an older version (see ``store.ensure_model``).
BUILDER_VERSION = 11
HEAD_PART_ROWS = 16384  # rows per LM-head part (see _head)
EXTERNAL_DATA_NAME = "model.onnx.data"


def _io(config: DecoderConfig) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    kv_shape: list[str | int] = ["batch", config.num_key_value_heads, "past_seq",
                                 config.head_dim]
    present_shape: list[str | int] = ["batch", config.num_key_value_heads, "total_seq",
                                      config.head_dim]
    int64, f32 = TensorProto.INT64, TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("input_ids", int64, ["batch", "seq"]),
              helper.make_tensor_value_info("attention_mask", int64, ["batch", "total_seq"]),
              helper.make_tensor_value_info("position_ids", int64, ["batch", "seq"])]
    outputs = [helper.make_tensor_value_info("logits", f32,
                                             ["batch", 1, config.vocab_size])]
    for i in range(config.num_hidden_layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", f32,
                                                        kv_shape))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", f32,
                                                         present_shape))
    return inputs, outputs


def build_decoder(config: DecoderConfig, weights: Mapping[str, Weight],
                  progress: Progress | None = None, *,
                  attention_op: str = "gqa", weight_op: str = "auto",
                  arith: str = "auto") -> onnx.ModelProto:
    """The decoder graph for ``config`` with ``weights`` (HF names) as initializers.

    ``progress(n)`` is called after each layer so long conversions can show a bar.
    ``attention_op``: ``"gqa"`` (default: ``com.microsoft.GroupQueryAttention``, KV
    updated in place when the session shares past/present buffers) or ``"matmul"`` (the
    spelled-out attention, bit-exact between one- and many-position passes). Families
    whose attention GQA's fused path does not express as we use it (Gemma 3's QK norm
    and sliding-window layers) are built with ``"matmul"`` whatever is asked: see
    :func:`uses_gqa`. ``logits`` holds the last position only: nothing reads the others,
    and the head over every prompt position was a fifth of a prefill's work.
    ``weight_op``: ``"qmatmul"`` (4- and 8-bit block-quantized weights in GGUF's blocks,
    our ``uniun.QMatMul`` kernel; what it does not take stays on ``MatMulNBits``),
    ``"matmulnbits"`` (onnxruntime's ``MatMulNBits`` for all) or ``"auto"`` (QMatMul where
    its library runs its vector path here: :func:`uniun.models.qmatmul.fast`).
    ``arith``: ``"ggml"`` (llama.cpp's arithmetic, bit for bit: :mod:`ggml_decoder`; an
    error for a model it does not apply to), ``"onnx"`` (the graph above) or ``"auto"``
    (ggml where it applies and this CPU runs its kernels fast: :func:`qmatmul.ggml_fast`).
    """
    if attention_op not in ("gqa", "matmul"):
        raise ValueError(f"attention_op must be gqa or matmul, not {attention_op!r}")
    if weight_op not in ("auto", "qmatmul", "matmulnbits"):
        raise ValueError(f"weight_op must be auto, qmatmul or matmulnbits, not {weight_op!r}")
    if arith not in ("auto", "ggml", "onnx"):
        raise ValueError(f"arith must be auto, ggml or onnx, not {arith!r}")
    use_qmatmul = weight_op == "qmatmul" or (weight_op == "auto" and qmatmul.fast())
    why_not = ("arith onnx" if arith == "onnx" else "weight_op matmulnbits"
               if weight_op == "matmulnbits" else ggml_unsupported(config, weights))
    if arith == "ggml" and why_not:
        raise ValueError(f"llama.cpp's arithmetic does not apply: {why_not}")
    ggml = arith == "ggml" or (arith == "auto" and not why_not and use_qmatmul
                               and qmatmul.ggml_fast())
    g = GraphBuilder(qmatmul=use_qmatmul, ggml=ggml)
    cfg = config
    eps = float(cfg.rms_norm_eps)

    embed = weights["model.embed_tokens.weight"]
    if isinstance(embed, BlockQuantized) and embed.bits == 8 and embed.offsets is None:
        # Look rows up in the 8-bit blocks themselves: 28 MB instead of a 113 MB float
        # copy for SmolLM2 (the tied head keeps its own MatMulNBits-shaped copy).
        rows, cols = embed.shape
        hidden = g.op("GatherBlockQuantized",
                      [g.const("model.embed_tokens.qweight",
                               embed.packed.reshape(rows, -1)[:, :cols]),
                       "input_ids", g.const("model.embed_tokens.scales", embed.scales)],
                      "embed", domain=MS_DOMAIN, gather_axis=0, quantize_axis=1,
                      block_size=embed.block_size, bits=8)[0]
    else:
        if isinstance(embed, BlockQuantized):
            embed = embed.dequantize()
        hidden = g.op("Gather", [g.const("model.embed_tokens.weight", embed), "input_ids"],
                      "embed", axis=0)[0]
    hidden = scale_rows(g, hidden, cfg.embedding_scale)
    if ggml:
        return _finish(g, cfg, weights, ggml_layers(g, cfg, weights, hidden, progress))
    cos, sin = rope_tables(cfg)
    g.const("rope.cos", cos)
    g.const("rope.sin", sin)
    if cfg.sliding_window and cfg.rope_local_base_freq:  # Gemma 3's local layers
        cos, sin = rope_tables(cfg, cfg.rope_local_base_freq)
        g.const("rope_local.cos", cos)
        g.const("rope_local.sin", sin)
    gqa = attention_op == "gqa" and uses_gqa(cfg)
    scale = cfg.attention_scale()
    if gqa:
        lengths = kv_lengths(g)
    else:
        group = cfg.num_attention_heads // cfg.num_key_value_heads
        bias = attention_bias(g, group)
        local_bias = attention_bias(g, group, cfg.sliding_window) if cfg.sliding_window else bias

    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        normed = _norm(g, hidden, weights, f"{p}.input_layernorm.weight", eps, f"l{i}_ln1")
        # The attention scale goes into Q's weights, or into the Q norm when one follows.
        q_scale = 1.0 if cfg.qk_norm else scale
        qkv = g.linear(normed, [scaled(weights[f"{p}.self_attn.q_proj.weight"], q_scale)]
                       + [weights[f"{p}.self_attn.{x}_proj.weight"] for x in ("k", "v")],
                       f"{p}.self_attn.qkv_proj", split=not gqa)
        biases = [weights.get(f"{p}.self_attn.{n}_proj.bias") for n in ("q", "k", "v")]
        if gqa:
            if biases[0] is not None:  # Qwen2: one bias over the fused projection
                fused = np.concatenate([np.asarray(biases[0], np.float32) * q_scale,
                                        *(np.asarray(b, np.float32) for b in biases[1:])])
                qkv = [add_bias(g, qkv[0], fused, f"{p}.self_attn.qkv_proj")]
            attn = gqa_attention(g, qkv[0], lengths, i, cfg)
        else:
            q, k, v = (add_bias(g, x, None if b is None else np.asarray(b) * f,
                                f"{p}.self_attn.{n}_proj")
                       for x, n, f, b in zip(qkv, "qkv", (q_scale, 1.0, 1.0), biases))
            if cfg.qk_norm:  # Gemma 3
                q = head_norm(g, q, np.asarray(weights[f"{p}.self_attn.q_norm.weight"]) * scale,
                              cfg.num_attention_heads, cfg.head_dim, eps,
                              f"{p}.self_attn.q_norm")
                k = head_norm(g, k, np.asarray(weights[f"{p}.self_attn.k_norm.weight"]),
                              cfg.num_key_value_heads, cfg.head_dim, eps,
                              f"{p}.self_attn.k_norm")
            local = cfg.is_local_layer(i)
            rope = "rope_local" if local and cfg.rope_local_base_freq else "rope"
            q = g.op("RotaryEmbedding", [q, f"{rope}.cos", f"{rope}.sin", "position_ids"],
                     f"l{i}_qrot", num_heads=cfg.num_attention_heads, interleaved=0)[0]
            k = g.op("RotaryEmbedding", [k, f"{rope}.cos", f"{rope}.sin", "position_ids"],
                     f"l{i}_krot", num_heads=cfg.num_key_value_heads, interleaved=0)[0]
            attn = attention(g, q, k, v, local_bias if local else bias, i, cfg)
        if cfg.sandwich_norms:  # Gemma: norm the attention output before the residual add
            attn = g.linear(attn, [weights[f"{p}.self_attn.o_proj.weight"]],
                            f"{p}.self_attn.o_proj")[0]
            attn = _norm(g, attn, weights, f"{p}.post_attention_layernorm.weight", eps,
                         f"l{i}_post_attn")
            hidden = g.op("Add", [hidden, attn], f"l{i}_res1")[0]
        else:
            hidden = g.linear(attn, [weights[f"{p}.self_attn.o_proj.weight"]],
                              f"{p}.self_attn.o_proj", residual=hidden)[0]
        pre_mlp = "pre_feedforward_layernorm" if cfg.sandwich_norms else "post_attention_layernorm"
        normed = _norm(g, hidden, weights, f"{p}.{pre_mlp}.weight", eps, f"l{i}_ln2")
        gate, up = g.linear(normed, [weights[f"{p}.mlp.gate_proj.weight"],
                                     weights[f"{p}.mlp.up_proj.weight"]], f"{p}.mlp.gate_up_proj")
        act = activation(g, gate, cfg.hidden_act, f"l{i}")
        gated = g.op("Mul", [act, up], f"l{i}_gated")[0]
        down = [weights[f"{p}.mlp.down_proj.weight"]]
        if cfg.sandwich_norms:
            mlp = _norm(g, g.linear(gated, down, f"{p}.mlp.down_proj")[0], weights,
                        f"{p}.post_feedforward_layernorm.weight", eps, f"l{i}_post_mlp")
            hidden = g.op("Add", [hidden, mlp], f"l{i}_res2")[0]
        else:
            hidden = g.linear(gated, down, f"{p}.mlp.down_proj", residual=hidden)[0]
        if progress:
            progress(1)

    return _finish(g, cfg, weights, _norm(g, last_position(g, hidden), weights,
                                          "model.norm.weight", eps, "final_norm"))


def _finish(g: GraphBuilder, cfg: DecoderConfig, weights: Mapping[str, Weight],
            normed: str) -> onnx.ModelProto:
    """The LM head over the last position's normed state, the I/O, and the model."""
    head = weights.get("lm_head.weight")
    if head is None:
        if not cfg.tie_word_embeddings:
            raise KeyError("lm_head.weight missing and tie_word_embeddings is false")
        head = weights["model.embed_tokens.weight"]
    logits = _head(g, normed, head)
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="logits_out"))

    inputs, outputs = _io(cfg)
    graph = helper.make_graph(g.nodes, "uniun_decoder", inputs, outputs, g.initializers)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
    if any(node.domain == qmatmul.DOMAIN for node in g.nodes):
        opsets.append(helper.make_opsetid(qmatmul.DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="uniun")
    model.ir_version = 10
    return model


def _head(g: GraphBuilder, x: str, head: Weight) -> str:
    """The LM head, as :data:`HEAD_PART_ROWS`-row ``MatMulNBits`` parts joined by a Concat.

    Why parts: onnxruntime prepacks a 4/8-bit weight at load while the original is still
    resident, so a whole 49,152-row head (SmolLM2, 27 MB of 8-bit codes) would raise the
    runner's peak RSS by its own size during the load, and Gemma 3's 262,144 rows by
    168 MB. Parts keep that transient to one part's size; the Concat of the logits is
    cheap beside a decode step.
    """
    n = head.shape[0]
    whole = g.qmatmul and isinstance(head, BlockQuantized) and packable(head)
    if not isinstance(head, BlockQuantized) or n <= HEAD_PART_ROWS or whole:
        return g.linear(x, [head], "lm_head")[0]  # QMatMul prepacks nothing: no transient
    parts = [g.linear(x, [head.rows(start, min(start + HEAD_PART_ROWS, n))],
                      f"lm_head.{j}")[0]
             for j, start in enumerate(range(0, n, HEAD_PART_ROWS))]
    return g.op("Concat", parts, "lm_head", axis=-1)[0]


def uses_gqa(cfg: DecoderConfig) -> bool:
    """Whether the fused ``GroupQueryAttention`` path expresses this config's attention:
    plain RoPE over Q and K straight from the projection (Llama, Qwen2). Gemma 3's QK norm
    sits between the projection and RoPE, and its local layers use another RoPE base and
    a window, so it keeps the spelled-out attention."""
    return not cfg.qk_norm and not cfg.sliding_window and cfg.rope_local_base_freq is None


def _norm(g: GraphBuilder, x: str, weights: Mapping[str, Weight], name: str, eps: float,
          hint: str) -> str:
    """RMSNorm of ``x`` with the weight called ``name`` (the initializer keeps that name)."""
    w = g.const(name, np.asarray(weights[name], np.float32))
    return g.op("RMSNormalization", [x, w], hint, epsilon=eps, axis=-1)[0]


def save_decoder(model: onnx.ModelProto, folder: Path, *, external: bool) -> list[Path]:
    """Write ``model.onnx`` (plus ``model.onnx.data`` when ``external``) into ``folder``.

    Large models keep weights in external data files: the protobuf limit is 2 GB and
    onnxruntime maps the data files instead of copying them. The blocks ``QMatMul`` reads
    go to a file of their own (:data:`qmatmul.DATA_FILE`): the kernel reads them from the
    mapping every pass, while the rest is copied into onnxruntime's own buffers at load,
    and the runner treats the two files accordingly (``models/mapped_pages.py``).
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    if not external:
        onnx.save_model(model, str(path))
        return [path]
    convert_model_to_external_data(model, all_tensors_to_one_file=True,
                                   location=EXTERNAL_DATA_NAME, size_threshold=1024)
    qblocks = [t for t in model.graph.initializer if t.name.endswith(QBLOCKS_SUFFIX)]
    for tensor in qblocks:
        set_external_data(tensor, qmatmul.DATA_FILE)
    onnx.save_model(model, str(path))
    written = [path, folder / EXTERNAL_DATA_NAME]
    return [*written, folder / qmatmul.DATA_FILE] if qblocks else written
