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

from tests.models.numpy_reference import NumpyLlama
from tests.models_cache import shared_store
from uniun.models import qmatmul
from uniun.models.convert.recipes import ensure_model


def _session(folder: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    qmatmul.prepare(opts, folder / "model.onnx")
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
        feeds = {"input_ids": np.array([[nxt]]),
                 "attention_mask": np.ones((1, total + 1), np.int64),
                 "position_ids": np.array([[total]]), **past}
        out = dict(zip(names, sess.run(None, feeds)))
        total += 1
    return tokens, first_logits


def test_tiny_model_matches_numpy_reference() -> None:
    from transformers import AutoTokenizer

    from uniun.models.convert.decoder_spec import DecoderConfig
    from uniun.models.convert.tiny import tiny_weights

    folder = ensure_model("tiny-1", shared_store())
    cfg = json.loads((folder / "config.json").read_text())
    ref = NumpyLlama(cfg, tiny_weights(DecoderConfig.from_hf_dict(cfg), seed=1))
    tok = AutoTokenizer.from_pretrained(str(folder))
    sess = _session(folder)
    for text in ["Hello world", "What is the capital of France?"]:
        prompt = tok(text)["input_ids"]
        tokens, logits = _greedy_onnx(sess, cfg, prompt, steps=8)
        np.testing.assert_allclose(logits, ref.logits(prompt)[-1], atol=1e-3, rtol=1e-3)
        assert tokens == ref.greedy(prompt, 8)


# -- the real model ---------------------------------------------------------------------
SMOLLM2 = "smollm2-135m-instruct"
# The int8 activations of MatMulNBits' fast path (llama.cpp quantises activations the
# same way) move the logits a little, mostly by a shift common to all tokens (softmax
# ignores it). Observed here: log-probabilities of the reference's top 20 tokens within
# 0.27, logits within 0.9 after removing the common shift, at a logit scale of ~25.
# Two tokens whose reference logits are closer than TIE are a tie at this precision.
TOP_LOGPROB_DIFF = 0.6
CENTERED_LOGIT_DIFF = 1.5
TIE = 0.5
PROMPTS = [
    [{"role": "user", "content": "What is the capital of Germany?"}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "How many legs does a spider have?"}],
]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max()
    return x - np.log(np.exp(x).sum())


@pytest.fixture(scope="module")
def smol(smollm2: str) -> tuple[Path, ort.InferenceSession, dict, NumpyLlama]:
    from tests.models.numpy_reference import load_gguf
    from uniun.models.convert.pull import source_file

    folder = ensure_model(smollm2, shared_store())
    cfg = json.loads((folder / "config.json").read_text())
    return folder, _session(folder), cfg, load_gguf(source_file(smollm2, shared_store()))


@pytest.mark.smollm2
def test_smollm2_matches_numpy_reference_of_the_gguf(smol) -> None:
    from transformers import AutoTokenizer

    folder, sess, cfg, ref = smol
    tok = AutoTokenizer.from_pretrained(str(folder))
    for messages in PROMPTS:
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True,
                                         tokenize=True)["input_ids"]
        tokens, logits = _greedy_onnx(sess, cfg, prompt, steps=8)
        # One reference pass over prompt + ONNX tokens gives the reference's view of
        # every step (teacher-forced along the ONNX path).
        ref_rows = ref.logits(prompt + tokens)[len(prompt) - 1:]
        want = ref_rows[0]
        diff = logits - want
        assert np.abs(diff - diff.mean()).max() < CENTERED_LOGIT_DIFF
        top = np.argsort(-want)[:20]
        assert np.abs(_log_softmax(logits)[top] - _log_softmax(want)[top]).max() \
            < TOP_LOGPROB_DIFF
        # Every ONNX pick is the reference's pick, or within TIE of it (a tie at this
        # weight format's precision).
        for i, token in enumerate(tokens):
            assert ref_rows[i].max() - ref_rows[i][token] < TIE, (messages, i, tokens)


@pytest.mark.smollm2
def test_smollm2_answers_a_factual_question(smol) -> None:
    from transformers import AutoTokenizer

    folder, sess, cfg, _ = smol
    tok = AutoTokenizer.from_pretrained(str(folder))
    prompt = tok.apply_chat_template(PROMPTS[0], add_generation_prompt=True,
                                     tokenize=True)["input_ids"]
    tokens, _ = _greedy_onnx(sess, cfg, prompt, steps=10)
    assert "Berlin" in tok.decode(tokens)


@pytest.mark.smollm2
def test_smollm2_tokenizer_and_chat_template_match_the_gguf(smollm2: str) -> None:
    import gguf
    from transformers import AutoTokenizer

    from uniun.models.convert.pull import source_file

    folder = ensure_model(smollm2, shared_store())
    reader = gguf.GGUFReader(str(source_file(smollm2, shared_store())))
    gguf_template = reader.fields["tokenizer.chat_template"].contents()
    gguf_tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    tok = AutoTokenizer.from_pretrained(str(folder))
    conversations = [
        [{"role": "user", "content": "Hi!"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "4"}, {"role": "user", "content": "Why?"}],
    ]
    for messages in conversations:
        for gen in (True, False):
            ours = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            theirs = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen,
                                             chat_template=gguf_template)
            assert ours == theirs
    assert tok.apply_chat_template(conversations[0], tokenize=False,
                                   add_generation_prompt=True) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")
    assert (tok.bos_token, tok.eos_token, tok.eos_token_id) == ("<|im_start|>", "<|im_end|>", 2)
    ids = tok("<|im_start|>user\nIn 2024, naïve café ☕ costs €3.50<|im_end|>")["input_ids"]
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(ids) == "<|im_start|>user\nIn 2024, naïve café ☕ costs €3.50<|im_end|>"
    pieces = [gguf_tokens[i] for i in tok("In 2024")["input_ids"]]
    assert pieces == ["In", "Ġ", "2", "0", "2", "4"]  # llama.cpp's smollm pre-tokenizer
