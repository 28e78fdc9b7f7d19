"""An independent numpy forward pass of a Llama / Qwen2 / Gemma 3 decoder.

Written from the papers and HF ``modeling_llama`` / ``modeling_qwen2`` /
``modeling_gemma3`` semantics, sharing no code with ``uniun.models`` on purpose: if the
converter misreads the GGUF (wrong permutation, wrong block layout, wrong RoPE, a
missing Gemma norm), this file does not inherit the mistake. It reads the GGUF with the
``gguf`` package's own ``dequantize`` and undoes llama.cpp's Q/K row permutation itself.
No KV cache: every call recomputes the whole sequence, which is slow but obviously right.

Config keys beyond a HF Llama ``config.json`` (all optional): ``embedding_scale``,
``hidden_act`` (``silu`` | ``gelu_pytorch_tanh``), ``sandwich_norms``, ``qk_norm``,
``sliding_window`` + ``sliding_window_pattern`` + ``rope_local_base_freq``,
``rope_freq_factors``; Q/K/V biases are used when present in the weights.
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


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


class NumpyLlama:
    """Full-sequence forward pass: ``logits(token_ids) -> [seq, vocab]`` (all families)."""

    def __init__(self, cfg: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
        self.cfg = cfg
        self.w = weights
        self.n_heads = int(cfg["num_attention_heads"])
        self.n_kv = int(cfg["num_key_value_heads"])
        self.head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // self.n_heads)
        self.eps = float(cfg["rms_norm_eps"])
        self.theta = float(cfg["rope_theta"])

    def _rope(self, x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
        # x: [heads, seq, head_dim]
        inv = 1.0 / theta ** (np.arange(0, self.head_dim, 2) / self.head_dim)
        if self.cfg.get("rope_freq_factors"):
            inv = inv / np.asarray(self.cfg["rope_freq_factors"], np.float64)
        ang = positions[:, None] * inv[None, :]
        emb = np.concatenate([ang, ang], axis=-1)
        cos, sin = np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
        return x * cos + _rotate_half(x) * sin

    def _local(self, layer: int) -> bool:
        pattern = int(self.cfg.get("sliding_window_pattern") or 0)
        return bool(self.cfg.get("sliding_window")) and pattern > 0 \
            and (layer + 1) % pattern != 0

    def _proj(self, h: np.ndarray, name: str) -> np.ndarray:
        y = h @ self.w[f"{name}.weight"].T
        bias = self.w.get(f"{name}.bias")
        return y if bias is None else y + bias

    def logits(self, token_ids: list[int]) -> np.ndarray:
        w, d, cfg = self.w, self.head_dim, self.cfg
        seq = len(token_ids)
        pos = np.arange(seq, dtype=np.float64)
        x = w["model.embed_tokens.weight"][np.asarray(token_ids)]
        x = x * np.float32(cfg.get("embedding_scale", 1.0))
        qi, ki = np.arange(seq)[:, None], np.arange(seq)[None, :]
        causal = np.where(ki <= qi, 0.0, -np.inf).astype(np.float32)
        window = int(cfg.get("sliding_window") or 0)
        local_mask = np.where((ki <= qi) & (qi - ki < max(window, 1)), 0.0,
                              -np.inf).astype(np.float32)
        sandwich = bool(cfg.get("sandwich_norms"))
        scale = float(cfg.get("query_pre_attn_scalar") or d) ** -0.5
        for i in range(int(cfg["num_hidden_layers"])):
            p = f"model.layers.{i}"
            h = _rms_norm(x, w[f"{p}.input_layernorm.weight"], self.eps)
            q = self._proj(h, f"{p}.self_attn.q_proj").reshape(seq, self.n_heads, d)
            k = self._proj(h, f"{p}.self_attn.k_proj").reshape(seq, self.n_kv, d)
            v = self._proj(h, f"{p}.self_attn.v_proj").reshape(seq, self.n_kv, d)
            if cfg.get("qk_norm"):
                q = _rms_norm(q, w[f"{p}.self_attn.q_norm.weight"], self.eps)
                k = _rms_norm(k, w[f"{p}.self_attn.k_norm.weight"], self.eps)
            local = self._local(i)
            theta = float(cfg.get("rope_local_base_freq") or self.theta) if local else self.theta
            q = self._rope(q.transpose(1, 0, 2), pos, theta)
            k = self._rope(k.transpose(1, 0, 2), pos, theta)
            v = v.transpose(1, 0, 2)
            rep = self.n_heads // self.n_kv
            k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
            scores = q @ k.transpose(0, 2, 1) * scale + (local_mask if local else causal)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            probs = scores / scores.sum(-1, keepdims=True)
            out = (probs @ v).transpose(1, 0, 2).reshape(seq, self.n_heads * d)
            out = out @ w[f"{p}.self_attn.o_proj.weight"].T
            if sandwich:
                out = _rms_norm(out, w[f"{p}.post_attention_layernorm.weight"], self.eps)
            x = x + out
            pre = "pre_feedforward_layernorm" if sandwich else "post_attention_layernorm"
            h = _rms_norm(x, w[f"{p}.{pre}.weight"], self.eps)
            gate = h @ w[f"{p}.mlp.gate_proj.weight"].T
            up = h @ w[f"{p}.mlp.up_proj.weight"].T
            act = (_gelu_tanh(gate) if cfg.get("hidden_act") == "gelu_pytorch_tanh"
                   else gate / (1.0 + np.exp(-gate)))
            mlp = (act * up) @ w[f"{p}.mlp.down_proj.weight"].T
            if sandwich:
                mlp = _rms_norm(mlp, w[f"{p}.post_feedforward_layernorm.weight"], self.eps)
            x = x + mlp
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


_PER_LAYER = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
              "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
              "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
              "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
              "post_attention_norm": "post_attention_layernorm",
              "post_ffw_norm": "post_feedforward_layernorm"}


def load_gguf(path: Path) -> NumpyLlama:
    """A :class:`NumpyLlama` from a llama / qwen2 / gemma3 GGUF, dequantised by ``gguf``."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(path))

    def field(name: str, default: Any = None) -> Any:
        f = reader.fields.get(name)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    heads = field(f"{arch}.attention.head_count")
    cfg: dict[str, Any] = {
        "num_hidden_layers": field(f"{arch}.block_count"),
        "hidden_size": field(f"{arch}.embedding_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": field(f"{arch}.attention.head_count_kv", heads),
        "head_dim": field(f"{arch}.attention.key_length"),
        "rms_norm_eps": field(f"{arch}.attention.layer_norm_rms_epsilon"),
        "rope_theta": field(f"{arch}.rope.freq_base", 10000.0),
    }
    if arch == "gemma3":  # HF Gemma3Config for the 270M-1B sizes; llama.cpp's constants
        cfg.update(embedding_scale=float(cfg["hidden_size"]) ** 0.5,
                   hidden_act="gelu_pytorch_tanh", sandwich_norms=True, qk_norm=True,
                   sliding_window=field("gemma3.attention.sliding_window"),
                   sliding_window_pattern=6, rope_local_base_freq=10000.0)
    names = {"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    ffn_norm = "pre_feedforward_layernorm" if arch == "gemma3" else "post_attention_layernorm"
    weights: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        arr = dequantize(t.data, t.tensor_type).astype(np.float32)
        arr = arr.reshape([int(s) for s in reversed(t.shape)])
        if t.name == "rope_freqs.weight":
            cfg["rope_freq_factors"] = [float(x) for x in arr.ravel()]
            continue
        if t.name in names:
            name = names[t.name]
        else:
            _, layer, kind, suffix = t.name.split(".")
            module = ffn_norm if kind == "ffn_norm" else _PER_LAYER[kind]
            name = f"model.layers.{layer}.{module}.{suffix}"
            if arch == "llama" and kind == "attn_q":
                arr = _unpermute_rows(arr, cfg["num_attention_heads"])
            elif arch == "llama" and kind == "attn_k":
                arr = _unpermute_rows(arr, cfg["num_key_value_heads"])
        weights[name] = arr
    if cfg["head_dim"] is None:
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    return NumpyLlama(cfg, weights)
