"""Build an ONNX graph for a Llama-style decoder from a weights dict and a config.

One builder serves every source (the tiny synthetic model, the GGUF conversion), so
every model in the store has the same graph shape and the same I/O contract, the one
optimum and onnxruntime-genai exports use (so imported folders look the same too):

- inputs: ``input_ids`` int64 [batch, seq]; ``attention_mask`` int64
  [batch, past_seq + seq]; ``position_ids`` int64 [batch, seq];
  ``past_key_values.{i}.key`` / ``.value`` float32 [batch, kv_heads, past_seq, head_dim]
- outputs: ``logits`` float32 [batch, seq, vocab]; ``present.{i}.key`` / ``.value``
  float32 [batch, kv_heads, past_seq + seq, head_dim]

Theory of operation: the graph uses the opset-23 ``RMSNormalization`` and
``RotaryEmbedding`` (HF "rotate half" layout, position-id indexed cos/sin tables);
attention is spelled out as MatMul / Softmax / MatMul over the query heads grouped by
KV head (GQA, past/present KV, bottom-right causal alignment; ``attention_mask`` adds
a key mask so left padding works) so a position's result does not depend on how many
positions share its pass (see :func:`_attention`). A linear weight is either a float
matrix (plain ``MatMul``) or a :class:`BlockQuantized` matrix
(``com.microsoft.MatMulNBits``), which lets a GGUF's Q4_1 / Q8_0 blocks run as they are
instead of being inflated to float32 — the choice that decodes fastest here (see
docs/models.md).

Weights use Hugging Face names (``model.layers.{i}.self_attn.q_proj.weight``, shape
[out, in]) so a reader can check them against any HF checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 23
# Bumped whenever the graph this module writes changes; the store rebuilds models it
# made with an older builder (see ``store.ensure_model``).
BUILDER_VERSION = 5
MS_DOMAIN = "com.microsoft"
EXTERNAL_DATA_NAME = "model.onnx.data"


@dataclass(frozen=True)
class DecoderConfig:
    """The architecture numbers, named as in a Hugging Face ``config.json``."""

    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    bos_token_id: int = 1
    eos_token_id: int = 2

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` a Hugging Face Llama loader (and our importer) expects."""
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "hidden_act": "silu", "torch_dtype": "float32", **asdict(self)}

    @classmethod
    def from_hf_dict(cls, raw: Mapping[str, Any]) -> DecoderConfig:
        """Read a HF ``config.json``; ``head_dim`` defaults to hidden / heads as in HF."""
        values = {f.name: raw[f.name] for f in fields(cls) if f.name in raw}
        if "head_dim" not in values:
            values["head_dim"] = int(raw["hidden_size"]) // int(raw["num_attention_heads"])
        eos = values.get("eos_token_id")
        if isinstance(eos, list):
            values["eos_token_id"] = int(eos[0])
        return cls(**values)


@dataclass(frozen=True)
class BlockQuantized:
    """A linear weight [n, k] in ``MatMulNBits`` layout, blocks of ``block_size`` along k.

    value = (code - 2 ** (bits - 1)) * scale + offset, per block. ``packed`` is uint8
    [n, k / block, block * bits / 8], codes packed low-first along k; ``scales`` and
    ``offsets`` are float32 [n, k / block]; ``offsets`` may be None (symmetric blocks).

    Why offsets instead of MatMulNBits' own zero points: a GGUF Q4_1 block is
    ``d * q + m``, which needs a *fractional* zero point ``-m / d``; onnxruntime only
    has its fast int8 kernels for integer zero points (float ones run ~10x slower). So
    the graph runs the symmetric kernel and adds ``blocksum(x) @ offsets.T``, a
    [k / 32]-wide matmul: exact, and cheap.
    """

    packed: np.ndarray
    scales: np.ndarray
    offsets: np.ndarray | None
    bits: int
    block_size: int
    shape: tuple[int, int]

    def dequantize(self) -> np.ndarray:
        """The float32 matrix [n, k] these blocks stand for."""
        n, k = self.shape
        if self.bits == 8:
            codes = self.packed.reshape(n, -1, self.block_size).astype(np.float32)
        elif self.bits == 4:
            codes = np.stack([self.packed & 0x0F, self.packed >> 4], axis=-1)
            codes = codes.reshape(n, -1, self.block_size).astype(np.float32)
        else:
            raise ValueError(f"unsupported bits={self.bits}")
        values = (codes - np.float32(2 ** (self.bits - 1))) * self.scales[..., None]
        if self.offsets is not None:
            values = values + self.offsets[..., None]
        return values.reshape(n, -1)[:, :k].astype(np.float32)

    @staticmethod
    def concat(parts: list[BlockQuantized]) -> BlockQuantized:
        """Stack weights that share an input along n (fused QKV, fused gate/up)."""
        first = parts[0]
        offsets = None
        if any(p.offsets is not None for p in parts):
            offsets = np.concatenate([p.offsets if p.offsets is not None
                                      else np.zeros_like(p.scales) for p in parts])
        return BlockQuantized(
            packed=np.concatenate([p.packed for p in parts]),
            scales=np.concatenate([p.scales for p in parts]), offsets=offsets,
            bits=first.bits, block_size=first.block_size,
            shape=(sum(p.shape[0] for p in parts), first.shape[1]))


Weight = np.ndarray | BlockQuantized
Progress = Callable[[int], None]


def rope_tables(config: DecoderConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [max_positions, head_dim / 2] for the HF default RoPE."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, half, dtype=np.float64) * 2
                                            / config.head_dim))
    angles = np.outer(np.arange(config.max_position_embeddings, dtype=np.float64), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class _Graph:
    """Collects nodes and initializers; names every intermediate uniquely."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self._count = 0
        self._sums: dict[tuple[str, int], str] = {}

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], hint: str, *, outputs: int = 1,
           out_names: list[str] | None = None, domain: str = "", **attrs: Any) -> list[str]:
        names = out_names or [self.name(hint) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.name(op_type),
                                           domain=domain or None, **attrs))
        return names

    def linear(self, x: str, weights: list[Weight], name: str) -> list[str]:
        """x @ w.T for each w, as one fused matmul split afterwards when possible.

        Fusing the projections that read the same input (Q/K/V, gate/up) halves the
        number of kernel launches per layer, which is most of the cost at batch 1.
        """
        quant = [w for w in weights if isinstance(w, BlockQuantized)]
        fusable = len(quant) in (0, len(weights)) and len(
            {(w.bits, w.block_size) for w in quant}) <= 1
        if len(weights) > 1 and not fusable:
            return [self.linear(x, [w], f"{name}.{j}")[0] for j, w in enumerate(weights)]
        if quant:
            fused = BlockQuantized.concat(quant) if len(quant) > 1 else quant[0]
            y = self._matmul_nbits(x, fused, name)
        else:
            w = np.concatenate(weights) if len(weights) > 1 else weights[0]
            w_t = self.const(f"{name}.weight_t", np.ascontiguousarray(w.T, dtype=np.float32))
            y = self.op("MatMul", [x, w_t], name)[0]
        if len(weights) == 1:
            return [y]
        sizes = self.const(f"{name}.split", np.array([w.shape[0] for w in weights], np.int64))
        return self.op("Split", [y, sizes], f"{name}.part", outputs=len(weights), axis=-1)

    def _matmul_nbits(self, x: str, w: BlockQuantized, name: str) -> str:
        n, k = w.shape
        inputs = [x, self.const(f"{name}.qweight", w.packed),
                  self.const(f"{name}.scales", w.scales.astype(np.float32))]
        # accuracy_level 4: int8 activations in blocks, the fast MLAS path on AVX-512
        # VNNI; the same trade llama.cpp makes (Q4_1 x Q8_1 dot products).
        y = self.op("MatMulNBits", inputs, name, domain=MS_DOMAIN, K=k, N=n, bits=w.bits,
                    block_size=w.block_size, accuracy_level=4)[0]
        if w.offsets is None:
            return y
        sums = self._block_sums(x, w.block_size)
        offsets_t = self.const(f"{name}.offsets_t",
                               np.ascontiguousarray(w.offsets.T, dtype=np.float32))
        correction = self.op("MatMul", [sums, offsets_t], f"{name}.offset")[0]
        return self.op("Add", [y, correction], f"{name}.out")[0]

    def _block_sums(self, x: str, block: int) -> str:
        """Sum of x over each k-block: [batch, seq, k / block], computed once per input."""
        key = (x, block)
        if key not in self._sums:
            shape = self.const(f"blocks_{block}_{self._count}", np.array([0, 0, -1, block],
                                                                      np.int64))
            blocks = self.op("Reshape", [x, shape], "blocks")[0]
            axes = self.const(f"axes_last_{self._count}", np.array([-1], np.int64))
            self._sums[key] = self.op("ReduceSum", [blocks, axes], "block_sum", keepdims=0)[0]
        return self._sums[key]


def _io(config: DecoderConfig) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    kv_shape = ["batch", config.num_key_value_heads, "past_seq", config.head_dim]
    present_shape = ["batch", config.num_key_value_heads, "total_seq", config.head_dim]
    int64, f32 = TensorProto.INT64, TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("input_ids", int64, ["batch", "seq"]),
              helper.make_tensor_value_info("attention_mask", int64, ["batch", "total_seq"]),
              helper.make_tensor_value_info("position_ids", int64, ["batch", "seq"])]
    outputs = [helper.make_tensor_value_info("logits", f32,
                                             ["batch", "seq", config.vocab_size])]
    for i in range(config.num_hidden_layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", f32,
                                                        kv_shape))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", f32,
                                                         present_shape))
    return inputs, outputs


def _attention_bias(g: _Graph, group: int) -> str:
    """Additive mask [batch, 1, group * seq, total_seq]: 0 where a query may look, else -3e38.

    Key padding (``attention_mask`` 0) and bottom-right causality (query i of a pass of
    ``seq`` sits at position total - seq + i), tiled once for the ``group`` query heads
    that share a KV head (see :func:`_attention`). A large finite value, not -inf, so a
    fully padded query row gives a harmless uniform softmax instead of NaN.
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
    bias = g.op("Where", [allowed, g.const("bias_open", np.array(0.0, np.float32)),
                          g.const("bias_shut", np.array(-3.0e38, np.float32))], "bias")[0]
    return g.op("Tile", [bias, g.const("bias_tile", np.array([1, 1, group, 1], np.int64))],
                "bias_grouped")[0]


def _scaled(w: Weight, factor: float) -> Weight:
    """``w * factor``: folds attention's 1/sqrt(head_dim) into the Q projection.

    Exact when ``factor`` is a power of two (head_dim 64 or 16: SmolLM2, tiny), and it
    saves a Mul per layer per step (measurable in decode at batch 1).
    """
    if isinstance(w, BlockQuantized):
        return replace(w, scales=w.scales * np.float32(factor),
                       offsets=None if w.offsets is None else w.offsets * np.float32(factor))
    return np.asarray(w, np.float32) * np.float32(factor)


def _attention(g: _Graph, q: str, k: str, v: str, bias: str, layer: int,
               cfg: DecoderConfig) -> str:
    """GQA attention with past/present KV from MatMul + Softmax, not the ``Attention`` op;
    ``q`` arrives already scaled by 1/sqrt(head_dim) (see :func:`_scaled`).

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


def build_decoder(config: DecoderConfig, weights: Mapping[str, Weight],
                  progress: Progress | None = None) -> onnx.ModelProto:
    """The decoder graph for ``config`` with ``weights`` (HF names) as initializers.

    ``progress(n)`` is called after each layer so long conversions can show a bar.
    """
    g = _Graph()
    cfg = config
    eps = float(cfg.rms_norm_eps)
    cos, sin = rope_tables(cfg)
    g.const("rope.cos", cos)
    g.const("rope.sin", sin)

    embed = weights["model.embed_tokens.weight"]
    if isinstance(embed, BlockQuantized) and embed.bits == 8 and embed.offsets is None:
        # Look rows up in the 8-bit blocks themselves: 28 MB instead of a 113 MB float
        # copy for SmolLM2 (the tied head keeps its own MatMulNBits-shaped copy).
        n, k = embed.shape
        hidden = g.op("GatherBlockQuantized",
                      [g.const("model.embed_tokens.qweight", embed.packed.reshape(n, -1)[:, :k]),
                       "input_ids", g.const("model.embed_tokens.scales", embed.scales)],
                      "embed", domain=MS_DOMAIN, gather_axis=0, quantize_axis=1,
                      block_size=embed.block_size, bits=8)[0]
    else:
        if isinstance(embed, BlockQuantized):
            embed = embed.dequantize()
        hidden = g.op("Gather", [g.const("model.embed_tokens.weight", embed), "input_ids"],
                      "embed", axis=0)[0]
    bias = _attention_bias(g, cfg.num_attention_heads // cfg.num_key_value_heads)

    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        normed = g.op("RMSNormalization",
                      [hidden, g.const(f"{p}.input_layernorm.weight",
                                       np.asarray(weights[f"{p}.input_layernorm.weight"],
                                                  np.float32))],
                      f"l{i}_ln1", epsilon=eps, axis=-1)[0]
        q, k, v = g.linear(normed, [_scaled(weights[f"{p}.self_attn.q_proj.weight"],
                                            cfg.head_dim ** -0.5)]
                           + [weights[f"{p}.self_attn.{x}_proj.weight"] for x in ("k", "v")],
                           f"{p}.self_attn.qkv_proj")
        q = g.op("RotaryEmbedding", [q, "rope.cos", "rope.sin", "position_ids"], f"l{i}_qrot",
                 num_heads=cfg.num_attention_heads, interleaved=0)[0]
        k = g.op("RotaryEmbedding", [k, "rope.cos", "rope.sin", "position_ids"], f"l{i}_krot",
                 num_heads=cfg.num_key_value_heads, interleaved=0)[0]
        attn = _attention(g, q, k, v, bias, i, cfg)
        attn = g.linear(attn, [weights[f"{p}.self_attn.o_proj.weight"]],
                        f"{p}.self_attn.o_proj")[0]
        hidden = g.op("Add", [hidden, attn], f"l{i}_res1")[0]
        normed = g.op("RMSNormalization",
                      [hidden, g.const(f"{p}.post_attention_layernorm.weight",
                                       np.asarray(weights[f"{p}.post_attention_layernorm.weight"],
                                                  np.float32))],
                      f"l{i}_ln2", epsilon=eps, axis=-1)[0]
        gate, up = g.linear(normed, [weights[f"{p}.mlp.gate_proj.weight"],
                                     weights[f"{p}.mlp.up_proj.weight"]], f"{p}.mlp.gate_up_proj")
        act = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"l{i}_sig")[0]], f"l{i}_silu")[0]
        mlp = g.linear(g.op("Mul", [act, up], f"l{i}_gated")[0],
                       [weights[f"{p}.mlp.down_proj.weight"]], f"{p}.mlp.down_proj")[0]
        hidden = g.op("Add", [hidden, mlp], f"l{i}_res2")[0]
        if progress:
            progress(1)

    normed = g.op("RMSNormalization",
                  [hidden, g.const("model.norm.weight",
                                   np.asarray(weights["model.norm.weight"], np.float32))],
                  "final_norm", epsilon=eps, axis=-1)[0]
    head = weights.get("lm_head.weight")
    if head is None:
        if not cfg.tie_word_embeddings:
            raise KeyError("lm_head.weight missing and tie_word_embeddings is false")
        head = weights["model.embed_tokens.weight"]
    logits = g.linear(normed, [head], "lm_head")[0]
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="logits_out"))

    inputs, outputs = _io(cfg)
    graph = helper.make_graph(g.nodes, "uniun_decoder", inputs, outputs, g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                   helper.make_opsetid(MS_DOMAIN, 1)],
                              producer_name="uniun")
    model.ir_version = 10
    return model


def save_decoder(model: onnx.ModelProto, folder: Path, *, external: bool) -> list[Path]:
    """Write ``model.onnx`` (plus ``model.onnx.data`` when ``external``) into ``folder``.

    Large models keep weights in one external data file: the protobuf limit is 2 GB and
    onnxruntime maps the data file instead of copying it.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=EXTERNAL_DATA_NAME,
                        size_threshold=1024)
        return [path, folder / EXTERNAL_DATA_NAME]
    onnx.save_model(model, str(path))
    return [path]
