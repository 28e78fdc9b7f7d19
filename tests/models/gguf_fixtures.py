"""Tiny GGUF files written with the ``gguf`` package's writer, for the import tests.

``write_tiny_gguf(path, arch, qtype)`` writes a 2-layer, hidden-64 decoder of the
llama, qwen2 or gemma3 family whose matrices are stored as ``qtype`` wherever the type
fits the row length (the k-quants need rows of 256: the attention output and MLP down
projections here) and as Q8_0 elsewhere, with a byte-level tokenizer of that family.

The ``gguf`` package quantizes Q4_0 ... Q8_0 and BF16 but not the k-quants, so
:func:`quantize_k` does (a plain min/max quantizer, not llama.cpp's search; what matters
here is a valid block layout, which the roundtrip test checks against ``gguf``'s own
dequantizer). Also used by ``scripts/make_kquant_gguf.py`` to requantize a real model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

QK_K = 256


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(len(x), 2)


def _pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Six-bit (scale, min) pairs of 8 sub-blocks -> the 12 bytes Q4_K / Q5_K use."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    out = np.zeros((len(sc), 12), np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (mn[:, 0:4] & 0x3F) | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return out


def _min_scale(x: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    sub = x.reshape(len(x), 8, 32)
    lo = np.minimum(sub.min(-1), 0.0)
    scale = np.maximum((sub.max(-1) - lo) / levels, 1e-8)
    d = (scale.max(-1) / 63).astype(np.float16).astype(np.float32)
    dmin = np.maximum((-lo).max(-1) / 63, 1e-8).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scale / np.maximum(d[:, None], 1e-12)), 1, 63)
    mn = np.clip(np.rint(-lo / np.maximum(dmin[:, None], 1e-12)), 0, 63)
    eff_s = d[:, None] * sc
    q = np.clip(np.rint((sub + (dmin[:, None] * mn)[..., None]) / eff_s[..., None]), 0, levels)
    return d, dmin, sc, mn, q.astype(np.uint8).reshape(len(x), QK_K)


def quantize_k(x: np.ndarray, kind: str) -> np.ndarray:
    """float32 [rows, cols] (cols % 256 == 0) -> GGUF Q4_K / Q5_K / Q6_K bytes [rows, -1]."""
    rows = x.shape[0]
    blocks = x.reshape(-1, QK_K).astype(np.float32)
    if kind in ("Q4_K", "Q5_K"):
        d, dmin, sc, mn, q = _min_scale(blocks, 15 if kind == "Q4_K" else 31)
        sub = q.reshape(len(q), 4, 2, 32)  # pairs of sub-blocks share bytes
        ql = ((sub[:, :, 0] & 0x0F) | ((sub[:, :, 1] & 0x0F) << 4)).reshape(len(q), 128)
        parts = [_f16(d), _f16(dmin), _pack_k_scales(sc, mn)]
        if kind == "Q5_K":
            hi = (q.reshape(len(q), 8, 32) >> 4) & 1
            parts.append(np.bitwise_or.reduce(hi << np.arange(8, dtype=np.uint8)[None, :, None],
                                              axis=1).astype(np.uint8))
        parts.append(ql.astype(np.uint8))
    elif kind == "Q6_K":
        sub = blocks.reshape(len(blocks), 16, 16)
        scale = np.abs(sub).max(-1) / 31
        d = np.maximum(np.abs(scale).max(-1) / 127, 1e-8).astype(np.float16).astype(np.float32)
        sc = np.clip(np.rint(scale / d[:, None]), 1, 127).astype(np.int8)
        eff = d[:, None] * sc.astype(np.float32)
        q = np.clip(np.rint(sub / eff[..., None]) + 32, 0, 63).astype(np.uint8)
        q = q.reshape(len(q), 2, 4, 32)  # [half, quarter, 32]
        ql = np.concatenate([(q[:, :, 0] & 0x0F) | ((q[:, :, 2] & 0x0F) << 4),
                             (q[:, :, 1] & 0x0F) | ((q[:, :, 3] & 0x0F) << 4)], axis=-1)
        qh = sum(((q[:, :, s] >> 4) & 3) << (2 * s) for s in range(4))
        parts = [ql.reshape(len(q), 128), qh.reshape(len(q), 64).astype(np.uint8),
                 sc.view(np.uint8), _f16(d)]
    else:
        raise ValueError(kind)
    return np.concatenate(parts, axis=-1).astype(np.uint8).reshape(rows, -1)


def encode(x: np.ndarray, kind: str) -> tuple[np.ndarray, object]:
    """``x`` as the bytes (or floats) of GGUF type ``kind``, and the type for the writer."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    if kind == "F32":
        return x.astype(np.float32), Q.F32
    if kind == "F16":
        return x.astype(np.float16), Q.F16
    if kind in ("Q4_K", "Q5_K", "Q6_K"):
        return quantize_k(x, kind), Q[kind]
    return quantize(x.astype(np.float32), Q[kind]), Q[kind]


def _byte_vocab(arch: str) -> dict:
    """A tiny tokenizer of the family's kind: 256 bytes, a few merges, the control tokens."""
    if arch == "gemma3":  # SentencePiece BPE with byte fallback (tokenizer.ggml.model llama)
        pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
        types = [3] * len(pieces)
        pieces += [f"<0x{b:02X}>" for b in range(256)]
        types += [6] * 256
        words = ["\u2581", "a", "b", "c", "e", "h", "l", "o", "t", "\u2581t", "he", "\u2581the",
                 "ll", "\u2581he", "llo", "\u2581hello", "\n"]
        pieces += words
        types += [1] * (len(words) - 1) + [4]
        scores = [0.0] * (len(pieces) - len(words)) + [-float(i) for i in range(len(words))]
        return {"model": "llama", "tokens": pieces, "types": types, "scores": scores,
                "bos": 2, "eos": 1, "pad": 0, "unk": 3,
                "template": None}
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    merges = ["h e", "l l", "he ll", "Ġ t", "Ġt he"]
    tokens = alphabet + [m.replace(" ", "") for m in merges] + ["<|im_start|>", "<|im_end|>"]
    types = [1] * (len(tokens) - 2) + [3, 3]
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                "{% endif %}")
    n = len(tokens)
    return {"model": "gpt2", "tokens": tokens, "types": types, "merges": merges,
            "bos": n - 2, "eos": n - 1, "template": template}


def write_tiny_gguf(path: Path, arch: str = "llama", qtype: str = "Q8_0", *,
                    seed: int = 0, hidden: int = 64, layers: int = 2,
                    extra_tensor: tuple[str, str] | None = None,
                    fields: dict[str, object] | None = None) -> Path:
    """A tiny ``arch`` GGUF with matrices in ``qtype`` (see module doc); its path.

    ``fields``: metadata written instead of the fixture's own (key -> value; None leaves
    the key out; ints are written as int32 so negative ones fit), for the refusal tests.
    """
    import gguf

    rng = np.random.default_rng(seed)
    heads, kv, head_dim, inter = 4, 2, 64, 256  # heads * head_dim = 256: k-quant rows fit
    tok = _byte_vocab(arch)
    vocab = len(tok["tokens"])
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}-{qtype}")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0 if arch != "qwen2" else 1e6)
    if arch == "gemma3":
        w.add_sliding_window(4)  # tiny, so a 10-token prompt crosses it
    w.add_tokenizer_model(tok["model"])
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    if "scores" in tok:
        w.add_token_scores(tok["scores"])
        w.add_add_space_prefix(False)
    if "merges" in tok:
        w.add_token_merges(tok["merges"])
        w.add_tokenizer_pre("smollm")
    w.add_bos_token_id(tok["bos"])
    w.add_eos_token_id(tok["eos"])
    if tok.get("pad") is not None:
        w.add_pad_token_id(tok["pad"])
    if tok.get("unk") is not None:
        w.add_unk_token_id(tok["unk"])
    w.add_add_bos_token(arch == "gemma3")
    if tok["template"]:
        w.add_chat_template(tok["template"])

    def matrix(name: str, rows: int, cols: int, kind: str | None = None) -> None:
        kind = kind or (qtype if cols % (QK_K if qtype.endswith("_K") else 32) == 0
                        else "Q8_0")
        data, raw = encode((rng.standard_normal((rows, cols)) * 0.5 / np.sqrt(cols))
                           .astype(np.float32), kind)
        w.add_tensor(name, data, raw_dtype=raw)  # uint8 data: its shape is the byte shape

    def vector(name: str, n: int, center: float = 1.0) -> None:
        w.add_tensor(name, (center + 0.1 * rng.standard_normal(n)).astype(np.float32))

    matrix("token_embd.weight", vocab, hidden, "Q8_0" if qtype.endswith("_K") else None)
    for i in range(layers):
        p = f"blk.{i}"
        vector(f"{p}.attn_norm.weight", hidden)
        matrix(f"{p}.attn_q.weight", heads * head_dim, hidden)
        matrix(f"{p}.attn_k.weight", kv * head_dim, hidden)
        matrix(f"{p}.attn_v.weight", kv * head_dim, hidden)
        if arch == "qwen2":
            for x, n in (("q", heads), ("k", kv), ("v", kv)):
                vector(f"{p}.attn_{x}.bias", n * head_dim, 0.0)
        if arch == "gemma3":
            vector(f"{p}.attn_q_norm.weight", head_dim)
            vector(f"{p}.attn_k_norm.weight", head_dim)
            vector(f"{p}.post_attention_norm.weight", hidden)
            vector(f"{p}.post_ffw_norm.weight", hidden)
        matrix(f"{p}.attn_output.weight", hidden, heads * head_dim)
        vector(f"{p}.ffn_norm.weight", hidden)
        matrix(f"{p}.ffn_gate.weight", inter, hidden)
        matrix(f"{p}.ffn_up.weight", inter, hidden)
        matrix(f"{p}.ffn_down.weight", hidden, inter)
    vector("output_norm.weight", hidden)
    if arch == "llama":  # untied head; qwen2 and gemma3 tie it to the embedding
        matrix("output.weight", vocab, hidden)
    if extra_tensor is not None:
        name, kind = extra_tensor
        _block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
        w.add_tensor(name, np.zeros((1, size), np.uint8),
                     raw_dtype=gguf.GGMLQuantizationType[kind])
    for key, value in (fields or {}).items():
        w.kv_data[0].pop(key, None)
        if value is None:
            continue
        vtype = {bool: gguf.GGUFValueType.BOOL, int: gguf.GGUFValueType.INT32,
                 float: gguf.GGUFValueType.FLOAT32, str: gguf.GGUFValueType.STRING}[type(value)]
        w.add_key_value(key, value, vtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
