"""A tiny synthetic decoder with the real I/O contract, built locally in about a second.

Unit tests of the session, the runner and the scheduler need *a* model that behaves
like the real one (same graph, same KV tensors, a real tokenizer with a chat template)
but loads and decodes in milliseconds. ``tiny-N`` is that model with random weights
drawn from seed ``N``; two seeds give two different "models" for swap tests. Its
tokenizer is a real byte-level BPE trained on a few built-in sentences, so any text
round-trips, and its chat template is the ChatML one SmolLM2 uses.

The weights are random, so the text it writes is gibberish — but deterministic, varied,
and it includes byte tokens that are not valid UTF-8 on their own (good for testing
incremental detokenisation). The lm_head rows of the special tokens are damped so
greedy decoding rarely ends on ``<|im_end|>`` by chance; tests that want EOS should
sample, use stop strings, or use the real model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from uniun.models.convert.decoder_spec import DecoderConfig
from uniun.models.convert.hf_folder import tokenizer_config, write_hf_files
from uniun.models.convert.onnx_decoder import BUILDER_VERSION, build_decoder, save_decoder
from uniun.models.store import ModelStore

if TYPE_CHECKING:
    import tokenizers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS, EOS = "<|im_start|>", "<|im_end|>"
VOCAB_SIZE = 512

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? The capital of France is Paris.",
    "You are a helpful assistant. Answer the question in one short sentence.",
    "The scheduler pauses background work when a person needs the model.",
    "Paused jobs resume from their saved cache instead of starting over.",
    "Extract the key facts from this note: meeting on Monday at ten.",
    "Write a short card about the history of the printing press.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024. Symbols: ( ) [ ] { } , ; : ! ? - + = * / #",
    "Once upon a time there was a small model that answered every question.",
    "Hello! How are you today? I am fine, thank you.",
]


def tiny_config(vocab_size: int) -> DecoderConfig:
    return DecoderConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         vocab_size=vocab_size, rms_norm_eps=1e-5, rope_theta=10000.0,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2)


def build_tokenizer() -> tokenizers.Tokenizer:
    """Byte-level BPE trained on the built-in corpus (deterministic, no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tok


def tiny_weights(config: DecoderConfig, seed: int) -> dict[str, np.ndarray]:
    """Random weights, scaled so activations stay O(1) through the layers."""
    rng = np.random.default_rng(seed)
    h, inter = config.hidden_size, config.intermediate_size
    q_out = config.num_attention_heads * config.head_dim
    kv_out = config.num_key_value_heads * config.head_dim

    def mat(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0.0, cols ** -0.5, (rows, cols)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.normal(size=h)).astype(np.float32)

    embed = rng.normal(0.0, 1.0, (config.vocab_size, h)).astype(np.float32)
    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": embed, "model.norm.weight": norm()}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = norm()
        w[f"{p}.self_attn.q_proj.weight"] = mat(q_out, h)
        w[f"{p}.self_attn.k_proj.weight"] = mat(kv_out, h)
        w[f"{p}.self_attn.v_proj.weight"] = mat(kv_out, h)
        w[f"{p}.self_attn.o_proj.weight"] = mat(h, q_out)
        w[f"{p}.post_attention_layernorm.weight"] = norm()
        w[f"{p}.mlp.gate_proj.weight"] = mat(inter, h)
        w[f"{p}.mlp.up_proj.weight"] = mat(inter, h)
        w[f"{p}.mlp.down_proj.weight"] = mat(h, inter)
    # An untied head: with random tied embeddings the model only repeats its last token.
    head = rng.normal(0.0, 1.0, (config.vocab_size, h)).astype(np.float32)
    head[: len(SPECIAL_TOKENS)] *= 0.05  # see module docstring
    w["lm_head.weight"] = head
    return w


def install_tiny(store: ModelStore, seed: int) -> None:
    """Build ``tiny-<seed>`` into ``store`` (caller holds the store lock for the id)."""
    tok = build_tokenizer()
    config = tiny_config(tok.get_vocab_size())
    assert tok.token_to_id(BOS) == config.bos_token_id
    assert tok.token_to_id(EOS) == config.eos_token_id
    model = build_decoder(config, tiny_weights(config, seed))
    with store.install(f"tiny-{seed}", kind="decoder", builder_version=BUILDER_VERSION,
                       weight_format="float32", source={"type": "tiny", "seed": seed}) as staging:
        save_decoder(model, staging, external=False)
        write_hf_files(staging, config, tok.to_str(),
                       tokenizer_config(BOS, EOS, CHAT_TEMPLATE, pad="<|endoftext|>",
                                        unk="<|endoftext|>", max_length=4096))


def install_tiny_id(store: ModelStore, model_id: str) -> None:
    """The store's recipe for ``tiny-<seed>`` (see ``convert.recipes``)."""
    install_tiny(store, int(model_id.removeprefix("tiny-")))
