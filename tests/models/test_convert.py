"""The converted ONNX decoders agree with an independent numpy forward pass.

The tiny model checks the graph builder in milliseconds; the ``smollm2`` tests check
the GGUF conversion (dequantisation, Q/K permutation, RoPE base, tied head) on the
real weights, and that its tokenizer and chat template match transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from numpy_reference import NumpyLlama

from uniun.models.store import ensure_model


def _session(folder: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(str(folder / "model.onnx"), opts,
                                providers=["CPUExecutionProvider"])


def _empty_past(cfg: dict, batch: int = 1) -> dict[str, np.ndarray]:
    shape = (batch, cfg["num_key_value_heads"], 0, cfg["head_dim"])
    return {f"past_key_values.{i}.{kind}": np.zeros(shape, np.float32)
            for i in range(cfg["num_hidden_layers"]) for kind in ("key", "value")}


def _greedy_onnx(sess: ort.InferenceSession, cfg: dict, prompt: list[int],
                 steps: int) -> tuple[list[int], np.ndarray]:
    """Prefill, then one token per step through the KV inputs; returns tokens + logits."""
    names = [o.name for o in sess.get_outputs()]
    feeds = {"input_ids": np.array([prompt]), "attention_mask": np.ones((1, len(prompt)), np.int64),
             "position_ids": np.arange(len(prompt))[None], **_empty_past(cfg)}
    out = dict(zip(names, sess.run(None, feeds)))
    first_logits = out["logits"][0, -1]
    tokens: list[int] = []
    total = len(prompt)
    for _ in range(steps):
        nxt = int(np.argmax(out["logits"][0, -1]))
        tokens.append(nxt)
        past = {k.replace("present", "past_key_values"): v for k, v in out.items()
                if k.startswith("present.")}
        feeds = {"input_ids": np.array([[nxt]]), "attention_mask": np.ones((1, total + 1), np.int64),
                 "position_ids": np.array([[total]]), **past}
        out = dict(zip(names, sess.run(None, feeds)))
        total += 1
    return tokens, first_logits


def test_tiny_model_matches_numpy_reference() -> None:
    from transformers import AutoTokenizer

    from uniun.models.onnx_decoder import DecoderConfig
    from uniun.models.tiny import tiny_weights

    folder = ensure_model("tiny-1")
    cfg = json.loads((folder / "config.json").read_text())
    ref = NumpyLlama(cfg, tiny_weights(DecoderConfig.from_hf_dict(cfg), seed=1))
    tok = AutoTokenizer.from_pretrained(str(folder))
    sess = _session(folder)
    for text in ["Hello world", "What is the capital of France?"]:
        prompt = tok(text)["input_ids"]
        tokens, logits = _greedy_onnx(sess, cfg, prompt, steps=8)
        np.testing.assert_allclose(logits, ref.logits(prompt)[-1], atol=1e-3, rtol=1e-3)
        assert tokens == ref.greedy(prompt, 8)
