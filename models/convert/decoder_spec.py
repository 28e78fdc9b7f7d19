"""What the decoder builder consumes: the architecture numbers and the weights.

Why apart from the builder: every source of a decoder (the tiny synthetic model, the GGUF
conversion, an imported Hugging Face folder) fills in these types, and most of them never
build a graph (``hf_folder`` only reads a config). :class:`DecoderConfig` is named as in a
Hugging Face ``config.json``; a :class:`Weight` is either a float matrix or a
:class:`BlockQuantized` one, which lets a GGUF's Q4_1 / Q8_0 blocks reach the graph as
they are instead of being inflated to float32 (see docs/models.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

__all__ = ["DecoderConfig", "BlockQuantized", "Weight", "Progress"]

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
    # --- family features (defaults: plain Llama; see docs/models.md "GGUF import") ------
    # "llama" | "qwen2" | "gemma3": the config.json model_type; the graph reads the flags.
    model_type: str = "llama"
    # "silu" (SwiGLU) or "gelu_pytorch_tanh" (Gemma's GeGLU, ONNX Gelu approximate=tanh).
    hidden_act: str = "silu"
    # Multiplier of the embedding rows (Gemma: sqrt(hidden_size)). 1.0: none.
    embedding_scale: float = 1.0
    # Gemma: RMSNorm of the attention output and of the MLP output before each residual
    # add (weights ``post_attention_layernorm`` / ``post_feedforward_layernorm``, the
    # pre-MLP norm is then ``pre_feedforward_layernorm``).
    sandwich_norms: bool = False
    # Gemma: per-head RMSNorm of Q and K before RoPE (``self_attn.q_norm`` / ``k_norm``).
    qk_norm: bool = False
    # Attention scale is query_pre_attn_scalar ** -0.5; None: head_dim (the usual).
    query_pre_attn_scalar: float | None = None
    # Local attention: a layer i with sliding_window_pattern > 0 and
    # (i + 1) % pattern != 0 sees only the last ``sliding_window`` positions and uses
    # RoPE base ``rope_local_base_freq`` (Gemma 3: 512, 6, 10000). None / 0: all global.
    sliding_window: int | None = None
    sliding_window_pattern: int = 0
    rope_local_base_freq: float | None = None
    # Llama 3.x "llama3" RoPE: per-frequency divisors (GGUF ``rope_freqs.weight``).
    rope_freq_factors: tuple[float, ...] | None = None

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` a Hugging Face loader (and our importer) expects."""
        arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "gemma3": "Gemma3ForCausalLM"}.get(self.model_type, "LlamaForCausalLM")
        raw = asdict(self)
        if raw["rope_freq_factors"] is not None:
            raw["rope_freq_factors"] = list(raw["rope_freq_factors"])
        return {"architectures": [arch], "torch_dtype": "float32", **raw}

    def is_local_layer(self, layer: int) -> bool:
        """Whether ``layer`` uses sliding-window attention (Gemma 3's 5 local : 1 global)."""
        return bool(self.sliding_window and self.sliding_window_pattern
                    and (layer + 1) % self.sliding_window_pattern != 0)

    def attention_scale(self) -> float:
        return float(self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @classmethod
    def from_hf_dict(cls, raw: Mapping[str, Any]) -> DecoderConfig:
        """Read a HF ``config.json``; ``head_dim`` defaults to hidden / heads as in HF."""
        values = {f.name: raw[f.name] for f in fields(cls) if f.name in raw}
        if "head_dim" not in values:
            values["head_dim"] = int(raw["hidden_size"]) // int(raw["num_attention_heads"])
        if isinstance(values.get("rope_freq_factors"), list):
            values["rope_freq_factors"] = tuple(values["rope_freq_factors"])
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
    has its fast int8 kernels for integer zero points (float ones run several times slower). So
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

    def rows(self, start: int, stop: int) -> BlockQuantized:
        """Output rows ``[start, stop)`` (views: blocks run along k, so rows split cleanly)."""
        return BlockQuantized(
            packed=self.packed[start:stop], scales=self.scales[start:stop],
            offsets=None if self.offsets is None else self.offsets[start:stop],
            bits=self.bits, block_size=self.block_size, shape=(stop - start, self.shape[1]))

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
