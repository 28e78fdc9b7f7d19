"""An independent numpy forward pass of a Llama decoder, for checking the ONNX graphs.

Written from the Llama paper / HF ``modeling_llama`` semantics, sharing no code with
``uniun.models`` on purpose: if the converter misreads the GGUF (wrong permutation,
wrong block layout, wrong RoPE), this file does not inherit the mistake. It reads the
GGUF with the ``gguf`` package's own ``dequantize`` and undoes llama.cpp's Q/K row
permutation itself. No KV cache: every call recomputes the whole sequence, which is
slow but obviously right.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
    return (x / np.sqrt(var + eps)).astype(np.float32) * w


def _rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class NumpyLlama:
    """Full-sequence forward pass: ``logits(token_ids) -> [seq, vocab]``."""

    def __init__(self, cfg: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
        self.cfg = cfg
        self.w = weights
        self.n_heads = int(cfg["num_attention_heads"])
        self.n_kv = int(cfg["num_key_value_heads"])
        self.head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // self.n_heads)
        self.eps = float(cfg["rms_norm_eps"])
        self.theta = float(cfg["rope_theta"])

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        # x: [heads, seq, head_dim]
        inv = 1.0 / self.theta ** (np.arange(0, self.head_dim, 2) / self.head_dim)
        ang = positions[:, None] * inv[None, :]
        emb = np.concatenate([ang, ang], axis=-1)
        cos, sin = np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
        return x * cos + _rotate_half(x) * sin

    def logits(self, token_ids: list[int]) -> np.ndarray:
        w, d = self.w, self.head_dim
        seq = len(token_ids)
        pos = np.arange(seq, dtype=np.float64)
        x = w["model.embed_tokens.weight"][np.asarray(token_ids)]
        causal = np.triu(np.full((seq, seq), -np.inf, dtype=np.float32), k=1)
        for i in range(int(self.cfg["num_hidden_layers"])):
            p = f"model.layers.{i}"
            h = _rms_norm(x, w[f"{p}.input_layernorm.weight"], self.eps)
            q = (h @ w[f"{p}.self_attn.q_proj.weight"].T).reshape(seq, self.n_heads, d)
            k = (h @ w[f"{p}.self_attn.k_proj.weight"].T).reshape(seq, self.n_kv, d)
            v = (h @ w[f"{p}.self_attn.v_proj.weight"].T).reshape(seq, self.n_kv, d)
            q = self._rope(q.transpose(1, 0, 2), pos)
            k = self._rope(k.transpose(1, 0, 2), pos)
            v = v.transpose(1, 0, 2)
            rep = self.n_heads // self.n_kv
            k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
            scores = q @ k.transpose(0, 2, 1) / np.sqrt(d) + causal
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            probs = scores / scores.sum(-1, keepdims=True)
            out = (probs @ v).transpose(1, 0, 2).reshape(seq, self.n_heads * d)
            x = x + out @ w[f"{p}.self_attn.o_proj.weight"].T
            h = _rms_norm(x, w[f"{p}.post_attention_layernorm.weight"], self.eps)
            gate = h @ w[f"{p}.mlp.gate_proj.weight"].T
            up = h @ w[f"{p}.mlp.up_proj.weight"].T
            x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[f"{p}.mlp.down_proj.weight"].T
        x = _rms_norm(x, w["model.norm.weight"], self.eps)
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        return (x @ head.T).astype(np.float32)

    def greedy(self, token_ids: list[int], steps: int) -> list[int]:
        ids = list(token_ids)
        out = []
        for _ in range(steps):
            nxt = int(np.argmax(self.logits(ids)[-1]))
            out.append(nxt)
            ids.append(nxt)
        return out


def _unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's ``permute``: its rows are (head, pair, 2); HF's are (head, 2, pair)."""
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def load_gguf(path: Path) -> NumpyLlama:
    """A :class:`NumpyLlama` from a llama-architecture GGUF, dequantised by ``gguf``."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(path))

    def field(name: str) -> Any:
        return reader.fields[name].contents()

    cfg = {
        "num_hidden_layers": field("llama.block_count"),
        "hidden_size": field("llama.embedding_length"),
        "num_attention_heads": field("llama.attention.head_count"),
        "num_key_value_heads": field("llama.attention.head_count_kv"),
        "rms_norm_eps": field("llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": field("llama.rope.freq_base"),
    }
    names = {"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    per_layer = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                 "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                 "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj"}
    weights: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        arr = dequantize(t.data, t.tensor_type).astype(np.float32)
        arr = arr.reshape([int(s) for s in reversed(t.shape)])
        if t.name in names:
            name = names[t.name]
        else:
            _, layer, kind, _ = t.name.split(".")
            name = f"model.layers.{layer}.{per_layer[kind]}.weight"
            if kind == "attn_q":
                arr = _unpermute_rows(arr, cfg["num_attention_heads"])
            elif kind == "attn_k":
                arr = _unpermute_rows(arr, cfg["num_key_value_heads"])
        weights[name] = arr
    return NumpyLlama(cfg, weights)
