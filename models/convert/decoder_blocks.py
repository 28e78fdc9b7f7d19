"""The building blocks of the decoder graph: a node collector and the attention pieces.

Why apart from :mod:`uniun.models.convert.onnx_decoder`: that module says *what* a
Llama-style decoder is (the layer loop, the I/O contract, how it is saved); this one says
*how* each piece is spelled in ONNX nodes, which is where the speed and the bit-exactness
come from: fused projections (one MatMul or ``com.microsoft.MatMulNBits`` per input, see
:meth:`GraphBuilder.linear`), the 1/sqrt(head_dim) scale folded into Q (:func:`scaled`),
and attention as MatMul / Softmax / MatMul over query heads grouped by KV head
(:func:`attention`), so a position's result does not depend on how many positions share
its pass.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from uniun.models import qmatmul
from uniun.models.convert.decoder_spec import BlockQuantized, DecoderConfig, Weight
from uniun.models.convert.qmatmul_pack import PackedWeight, pack

__all__ = ["GraphBuilder", "rope_tables", "attention_bias", "scaled", "attention", "kv_lengths",
           "gqa_attention", "MS_DOMAIN", "QBLOCKS_SUFFIX", "add_bias", "head_norm", "activation",
           "scale_rows", "last_position"]

MS_DOMAIN = "com.microsoft"
QBLOCKS_SUFFIX = ".qblocks"  # initializers QMatMul reads; saved to a file of their own


def rope_tables(config: DecoderConfig, base: float | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [max_positions, head_dim / 2] for the HF default RoPE.

    ``base`` overrides ``rope_theta`` (Gemma 3's local layers); ``rope_freq_factors``
    (Llama 3.x) divide the frequencies as llama.cpp's ``rope_freqs`` tensor does.
    """
    half = config.head_dim // 2
    theta = config.rope_theta if base is None else base
    inv_freq = 1.0 / (theta ** (np.arange(0, half, dtype=np.float64) * 2 / config.head_dim))
    if config.rope_freq_factors is not None:
        inv_freq = inv_freq / np.asarray(config.rope_freq_factors, np.float64)[:half]
    angles = np.outer(np.arange(config.max_position_embeddings, dtype=np.float64), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class GraphBuilder:
    """Collects nodes and initializers; names every intermediate uniquely.

    ``qmatmul``: write the block-quantized weights our kernel takes (:func:`pack`) as
    ``uniun.QMatMul`` nodes; the rest, and every weight when False, as ``MatMulNBits``.
    ``ggml``: those nodes sum in llama.cpp's order (``ggml=1``; see ``ggml_decoder``).
    """

    def __init__(self, *, qmatmul: bool = False, ggml: bool = False) -> None:
        self.qmatmul = qmatmul or ggml
        self.ggml = ggml
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self._count = 0
        self._sums: dict[tuple[str, int], str] = {}
        self._const_names: set[str] = set()

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, name: str, value: np.ndarray) -> str:
        """An initializer; a name already given is reused (attention_bias runs twice for
        models with local layers, and its small constants have fixed names)."""
        if name in self._const_names:
            return name
        self._const_names.add(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], hint: str, *, outputs: int = 1,
           out_names: list[str] | None = None, domain: str = "", **attrs: Any) -> list[str]:
        names = out_names or [self.name(hint) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.name(op_type),
                                           domain=domain or None, **attrs))
        return names

    def linear(self, x: str, weights: list[Weight], name: str, *,
               split: bool = True, residual: str | None = None) -> list[str]:
        """x @ w.T for each w, as one fused matmul split afterwards when possible.

        Fusing the projections that read the same input (Q/K/V, gate/up) halves the
        number of kernel launches per layer, which is most of the cost at batch 1.
        ``split=False``: return the one fused output (GroupQueryAttention takes packed QKV).
        ``residual`` (one weight only): return ``residual + x @ w.T``, added in the same
        node as a Q4_1 offset correction (one ``Sum`` instead of two ``Add``).
        """
        if residual is not None and len(weights) != 1:
            raise ValueError("a residual joins a single projection")
        quant = [w for w in weights if isinstance(w, BlockQuantized)]
        fusable = len(quant) in (0, len(weights)) and len(
            {(w.bits, w.block_size) for w in quant}) <= 1
        if len(weights) > 1 and not fusable:
            if not split:
                parts = [self.linear(x, [w], f"{name}.{j}")[0] for j, w in enumerate(weights)]
                return self.op("Concat", parts, f"{name}.packed", axis=-1)
            return [self.linear(x, [w], f"{name}.{j}")[0] for j, w in enumerate(weights)]
        if quant:
            fused = BlockQuantized.concat(quant) if len(quant) > 1 else quant[0]
            packed = pack(fused) if self.qmatmul else None
            y = (self._qmatmul(x, packed, name, residual) if packed is not None
                 else self._matmul_nbits(x, fused, name, residual))
        else:
            dense = [w for w in weights if not isinstance(w, BlockQuantized)]  # all of them
            w = np.concatenate(dense) if len(dense) > 1 else dense[0]
            w_t = self.const(f"{name}.weight_t", np.ascontiguousarray(w.T, dtype=np.float32))
            y = self.op("MatMul", [x, w_t], name)[0]
            if residual is not None:
                y = self.op("Add", [residual, y], f"{name}.res")[0]
        if len(weights) == 1 or not split:
            return [y]
        sizes = self.const(f"{name}.split", np.array([w.shape[0] for w in weights], np.int64))
        return self.op("Split", [y, sizes], f"{name}.part", outputs=len(weights), axis=-1)

    def _qmatmul(self, x: str, w: PackedWeight, name: str, residual: str | None) -> str:
        """``[residual +] x @ w.T`` in one ``uniun.QMatMul``: the whole dot product (a Q4_1
        block's offset term included) and the residual add in one node."""
        blocks = self.const(f"{name}{QBLOCKS_SUFFIX}", w.data)
        inputs = [x, blocks] + ([residual] if residual is not None else [])
        extra: dict[str, Any] = {"ggml": 1} if self.ggml else {}
        return self.op(qmatmul.OP_TYPE, inputs, name, domain=qmatmul.DOMAIN, K=w.k, N=w.n,
                       format=w.format, **extra)[0]

    def _matmul_nbits(self, x: str, w: BlockQuantized, name: str,
                      residual: str | None = None) -> str:
        n, k = w.shape
        inputs = [x, self.const(f"{name}.qweight", w.packed),
                  self.const(f"{name}.scales", w.scales.astype(np.float32))]
        # accuracy_level 4: int8 activations in blocks, the fast MLAS path on AVX-512
        # VNNI; the same trade llama.cpp makes (Q4_1 x Q8_1 dot products).
        y = self.op("MatMulNBits", inputs, name, domain=MS_DOMAIN, K=k, N=n, bits=w.bits,
                    block_size=w.block_size, accuracy_level=4)[0]
        terms = [y] if residual is None else [residual, y]
        if w.offsets is not None:
            offsets_t = self.const(f"{name}.offsets_t",
                                   np.ascontiguousarray(w.offsets.T, dtype=np.float32))
            terms.append(self.op("MatMul", [self._block_sums(x, w.block_size), offsets_t],
                                 f"{name}.offset")[0])
        if len(terms) == 1:
            return y
        return self.op("Add" if len(terms) == 2 else "Sum", terms, f"{name}.out")[0]

    def _block_sums(self, x: str, block: int) -> str:
        """Sum of x over each k-block: [batch, seq, k / block], computed once per input.

        Reshape + ReduceSum: of the spellings measured (docs/models.md) the fastest in a
        64-position prefill pass; an AveragePool (one node) saved ~1 % of a decode step
        but cost ~4 % of a prefill, a MatMul with a 0/1 matrix cost more in both.
        """
        key = (x, block)
        if key not in self._sums:
            shape = self.const(f"blocks_{block}", np.array([0, 0, -1, block], np.int64))
            blocks = self.op("Reshape", [x, shape], "blocks")[0]
            self._sums[key] = self.op("ReduceSum", [blocks, self.const(
                "axes_last", np.array([-1], np.int64))], "block_sum", keepdims=0)[0]
        return self._sums[key]


def attention_bias(g: GraphBuilder, group: int, window: int | None = None) -> str:
    """Additive mask [batch, 1, group * seq, total_seq]: 0 where a query may look, else -3e38.

    Key padding (``attention_mask`` 0) and bottom-right causality (query i of a pass of
    ``seq`` sits at position total - seq + i), tiled once for the ``group`` query heads
    that share a KV head (see :func:`attention`). A large finite value, not -inf, so a
    fully padded query row gives a harmless uniform softmax instead of NaN. ``window``
    (sliding-window layers) also shuts keys ``window`` or more positions behind the query.
    """
    mask = g.op("Cast", ["attention_mask"], "mask_bool", to=TensorProto.BOOL)[0]
    mask = g.op("Unsqueeze", [mask, g.const("axes_1_2", np.array([1, 2], np.int64))],
                "mask4d")[0]  # [batch, 1, 1, total]
    total = g.op("Shape", ["attention_mask"], "total_len", start=1, end=2)[0]
    seq = g.op("Shape", ["input_ids"], "seq_len", start=1, end=2)[0]
    axis0 = g.const("axes_0", np.array([0], np.int64))
    total, seq = (g.op("Squeeze", [x, axis0], "scalar")[0] for x in (total, seq))
    zero, one = g.const("int_0", np.array(0, np.int64)), g.const("int_1", np.array(1, np.int64))
    keys = g.op("Range", [zero, total, one], "key_pos")[0]  # [total]
    queries = g.op("Add", [g.op("Range", [zero, seq, one], "query_idx")[0],
                           g.op("Sub", [total, seq], "past_len")[0]], "query_pos")[0]
    queries = g.op("Unsqueeze", [queries, g.const("axes_1", np.array([1], np.int64))],
                   "query_col")[0]  # [seq, 1]
    allowed = g.op("And", [mask, g.op("LessOrEqual", [keys, queries], "causal")[0]],
                   "allowed")[0]  # [batch, 1, seq, total]
    if window:
        near = g.op("Less", [g.op("Sub", [queries, keys], "distance")[0],
                             g.const(g.name("window"), np.array(window, np.int64))], "near")[0]
        allowed = g.op("And", [allowed, near], "allowed_local")[0]
    bias = g.op("Where", [allowed, g.const("bias_open", np.array(0.0, np.float32)),
                          g.const("bias_shut", np.array(-3.0e38, np.float32))], "bias")[0]
    return g.op("Tile", [bias, g.const("bias_tile", np.array([1, 1, group, 1], np.int64))],
                "bias_grouped")[0]


def scaled(w: Weight, factor: float) -> Weight:
    """``w * factor``: folds attention's 1/sqrt(head_dim) into the Q projection.

    Exact when ``factor`` is a power of two (head_dim 64 or 16: SmolLM2, tiny), and it
    saves a Mul per layer per step (measurable in decode at batch 1).
    """
    if isinstance(w, BlockQuantized):
        return replace(w, scales=w.scales * np.float32(factor),
                       offsets=None if w.offsets is None else w.offsets * np.float32(factor))
    return np.asarray(w, np.float32) * np.float32(factor)


def attention(g: GraphBuilder, q: str, k: str, v: str, bias: str, layer: int,
               cfg: DecoderConfig) -> str:
    """GQA attention with past/present KV from MatMul + Softmax, not the ``Attention`` op;
    ``q`` arrives already scaled by 1/sqrt(head_dim) (see :func:`scaled`).

    Why not the opset-23 ``Attention`` op: onnxruntime computes a one-query pass on a
    different kernel path than a many-query pass, so a position's logits moved by up to
    ~1 (after int8 activation quantisation amplified the ulp-level change) between a
    decode step and a batched pass, and resumes had to replay generated tokens one pass
    each. Here the query heads that share a KV head are stacked as rows, so a
    one-position pass multiplies ``group`` rows and, for GQA (group >= 2: SmolLM2 3,
    tiny 2), takes the same MLAS path as a prefill: a position comes out bit for bit
    the same whichever pass feeds it (and many-position passes match the ``Attention``
    op's bit for bit). Decode speed is within noise of the op's (docs/models.md).
    """
    heads, kv_heads, dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    t = f"l{layer}_attn"
    presents = []
    kv_shape = g.const(f"{t}.kv_shape", np.array([0, 0, kv_heads, dim], np.int64))
    for x, kind in ((k, "key"), (v, "value")):
        split = g.op("Reshape", [x, kv_shape], t)[0]
        heads_first = g.op("Transpose", [split], t, perm=[0, 2, 1, 3])[0]
        presents.append(g.op("Concat", [f"past_key_values.{layer}.{kind}", heads_first], t,
                             out_names=[f"present.{layer}.{kind}"], axis=2)[0])
    key, value = presents
    split = g.op("Reshape", [q, g.const(f"{t}.q_shape", np.array([0, 0, heads, dim],
                                                                np.int64))], t)[0]
    heads_first = g.op("Transpose", [split], t, perm=[0, 2, 1, 3])[0]  # [b, heads, seq, dim]
    grouped = g.op("Reshape", [heads_first, g.const(f"{t}.group_shape", np.array(
        [0, kv_heads, -1, dim], np.int64))], t)[0]  # [b, kv_heads, group * seq, dim]
    scores = g.op("MatMul", [grouped, g.op("Transpose", [key], t, perm=[0, 1, 3, 2])[0]], t)[0]
    probs = g.op("Softmax", [g.op("Add", [scores, bias], t)[0]], t, axis=-1)[0]
    out = g.op("MatMul", [probs, value], t)[0]  # [b, kv_heads, group * seq, dim]
    out = g.op("Reshape", [out, g.const(f"{t}.head_shape", np.array([0, heads, -1, dim],
                                                                   np.int64))], t)[0]
    out = g.op("Transpose", [out], t, perm=[0, 2, 1, 3])[0]
    return g.op("Reshape", [out, g.const(f"{t}.out_shape", np.array([0, 0, heads * dim],
                                                                   np.int64))], t)[0]



def kv_lengths(g: GraphBuilder) -> tuple[str, str]:
    """``seqlens_k`` (int32 [batch], valid keys - 1) and ``total_sequence_length`` (int32
    scalar) for ``GroupQueryAttention``, from ``attention_mask`` [batch, total_seq].

    Why from the mask and not from ``past_key``'s shape: the session feeds KV buffers
    longer than what they hold (preallocated, updated in place, see ``models/kv.py``);
    the mask's width is what is valid.
    """
    axes = g.const("axes_1_sum", np.array([1], np.int64))
    valid = g.op("ReduceSum", ["attention_mask", axes], "valid_keys", keepdims=0)[0]
    seqlens = g.op("Sub", [valid, g.const("int64_1", np.array([1], np.int64))], "seqlens")[0]
    seqlens = g.op("Cast", [seqlens], "seqlens_k", to=TensorProto.INT32)[0]
    total = g.op("Shape", ["attention_mask"], "total_1d", start=1, end=2)[0]
    total = g.op("Squeeze", [total, g.const("axes_0_total", np.array([0], np.int64))],
                 "total_seq")[0]
    return seqlens, g.op("Cast", [total], "total_seq_i32", to=TensorProto.INT32)[0]


def gqa_attention(g: GraphBuilder, qkv: str, lengths: tuple[str, str], layer: int,
                  cfg: DecoderConfig) -> str:
    """Attention as one ``com.microsoft.GroupQueryAttention`` node over the fused QKV
    projection (RoPE inside the node, ``do_rotary``), past/present KV in BNSH.

    Why this op: one kernel per layer instead of ~16 nodes (split, two RoPEs, reshapes,
    transposes, a concat that copies the whole past every step, two matmuls, the bias),
    and, when the session binds ``present`` to the very buffer it feeds as ``past``
    (``past_present_share_buffer``), the new positions are written in place: no per-step
    allocation or copy of the KV. ``q`` arrives scaled by 1/sqrt(head_dim) (see
    :func:`scaled`), so ``scale`` is 1. Its one-position passes are not bit-equal to its
    many-position ones; ``DecoderModel.exact_replay`` probes that and resumes replay
    token by token (docs/kv-cache.md).
    """
    seqlens, total = lengths
    out = g.op("GroupQueryAttention",
               [qkv, "", "", f"past_key_values.{layer}.key", f"past_key_values.{layer}.value",
                seqlens, total, "rope.cos", "rope.sin"], f"l{layer}_gqa",
               out_names=[g.name(f"l{layer}_gqa_out"), f"present.{layer}.key",
                          f"present.{layer}.value"],
               domain=MS_DOMAIN, num_heads=cfg.num_attention_heads,
               kv_num_heads=cfg.num_key_value_heads, scale=1.0, do_rotary=1,
               rotary_interleaved=0)
    return out[0]


# --- family pieces (qwen2, gemma3): used only when the config or weights ask for them ---

def add_bias(g: GraphBuilder, x: str, bias: np.ndarray | None, name: str) -> str:
    """``x + bias`` (Qwen2's Q/K/V biases); ``x`` unchanged when there is none."""
    if bias is None:
        return x
    return g.op("Add", [x, g.const(f"{name}.bias", np.asarray(bias, np.float32))], name)[0]


def head_norm(g: GraphBuilder, x: str, weight: np.ndarray, heads: int, dim: int,
              eps: float, name: str) -> str:
    """RMSNorm of each head's slice of ``x`` [b, s, heads * dim] (Gemma 3's QK norm)."""
    split = g.op("Reshape", [x, g.const(f"{name}.shape", np.array([0, 0, heads, dim],
                                                                 np.int64))], name)[0]
    normed = g.op("RMSNormalization", [split, g.const(f"{name}.weight",
                                                      np.asarray(weight, np.float32))],
                  name, epsilon=eps, axis=-1)[0]
    return g.op("Reshape", [normed, g.const(f"{name}.flat", np.array([0, 0, heads * dim],
                                                                     np.int64))], name)[0]


def activation(g: GraphBuilder, gate: str, kind: str, name: str) -> str:
    """The gated MLP's activation: SiLU (Llama, Qwen2) or tanh-GELU (Gemma)."""
    if kind == "silu":
        return g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{name}_sig")[0]], f"{name}_silu")[0]
    if kind in ("gelu_pytorch_tanh", "gelu_tanh"):
        return g.op("Gelu", [gate], f"{name}_gelu", approximate="tanh")[0]
    raise ValueError(f"unsupported hidden_act {kind!r}")


def last_position(g: GraphBuilder, x: str) -> str:
    """``x[:, -1:]``: the head runs on the last position only (nothing reads the others)."""
    return g.op("Slice", [x, g.const("last_start", np.array([-1], np.int64)),
                          g.const("last_end", np.array([2 ** 62], np.int64)),
                          g.const("last_axis", np.array([1], np.int64))], "last_pos")[0]


def scale_rows(g: GraphBuilder, x: str, factor: float) -> str:
    """``x * factor`` (Gemma's embedding scale sqrt(hidden)); ``x`` when factor is 1."""
    if factor == 1.0:
        return x
    return g.op("Mul", [x, g.const("embed.scale", np.array(factor, np.float32))], "embed_scaled")[0]
