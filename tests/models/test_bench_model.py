"""Bench models (``models make-bench``): the writer's files import and run like a user's.

The 1B and 3B files are gigabytes, so these tests use a scaled-down shape through the
same writer, the same ``models import`` path and the same command (its shape table is
swapped for small shapes); what a user would notice is checked: the model loads,
generates varied tokens that decode, the manifest names its architecture and format, a
second call reuses what the first made, and a damaged file is made again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from uniun.models.convert import bench_model
from uniun.models.convert.bench_model import BenchShape, write_bench_gguf
from uniun.models.store import ModelStore
from uniun.runtime.bench.model_table import model_files
from uniun.runtime.cli import main

SMOLLM2_TOKENS = 49_152
# Llama 3.2's kinds of numbers, scaled down: GQA, head size 64, a vocabulary larger
# than the tokenizer's (so filler tokens exist), RoPE scaling.
SMALL = BenchShape("1b", "a small llama", hidden=256, layers=2, heads=4, kv_heads=2,
                   head_dim=64, ffn=512, vocab=SMOLLM2_TOKENS + 96, context=4096)
SMALL_B = BenchShape("3b", "another small llama", hidden=128, layers=3, heads=2, kv_heads=1,
                     head_dim=64, ffn=256, vocab=SMOLLM2_TOKENS + 32, context=4096)


@pytest.fixture(scope="module")
def tokenizer_gguf(smollm2: str) -> Path:
    from tests.models_cache import shared_store
    from uniun.models.convert.pull import source_file

    return source_file(smollm2, shared_store(), progress=False)


@pytest.fixture
def store(tmp_path: Path, tokenizer_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> ModelStore:
    """A store of its own, with the pulled SmolLM2 file in its sources (no download)."""
    root = tmp_path / "models"
    (root / ".sources").mkdir(parents=True)
    (root / ".sources" / tokenizer_gguf.parent.name).symlink_to(tokenizer_gguf.parent)
    monkeypatch.setenv("UNIUN_MODELS", str(root))
    monkeypatch.setitem(bench_model.SHAPES, "1b", SMALL)
    monkeypatch.setitem(bench_model.SHAPES, "3b", SMALL_B)
    return ModelStore(root)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_small_bench_model_imports_loads_and_generates_tokens_that_decode(
        tmp_path: Path, tokenizer_gguf: Path, store: ModelStore,
        capsys: pytest.CaptureFixture[str]) -> None:
    from uniun.models.session import DecoderSession

    path = tmp_path / "small.gguf"
    write_bench_gguf(path, SMALL, "Q4_1", seed=3, tokenizer_gguf=tokenizer_gguf)
    assert main(["models", "import", str(path), "--id", "bench-small"]) == 0
    assert "llama" in capsys.readouterr().out
    manifest = store.manifest("bench-small")
    assert manifest["architecture"] == "llama"
    assert manifest["weight_format"] == "gguf-q4_1+q8_0-nbits"  # the embedding is Q8_0
    config = json.loads((store.folder("bench-small") / "config.json").read_text())
    assert (config["vocab_size"], config["hidden_size"], config["num_key_value_heads"]) == \
        (SMALL.vocab, SMALL.hidden, SMALL.kv_heads)
    assert config["tie_word_embeddings"] is True

    session = DecoderSession.load(store.path("bench-small"), threads=1)
    gen = session.start(messages=[{"role": "user", "content": "Tell me about the sea."}],
                        max_new_tokens=24, ignore_eos=True)  # greedy
    ids = [event.token_id for event in session.generate(gen)]
    assert len(ids) == 24 and len(set(ids)) >= 4  # varied, not one token over and over
    assert all(0 <= i < SMALL.vocab for i in ids)
    for i in ids:
        assert session.tokenizer.decode([i]) != ""  # every picked id decodes to text


def test_every_filler_id_decodes_to_its_name_and_encoding_never_yields_one(
        tmp_path: Path, tokenizer_gguf: Path, store: ModelStore) -> None:
    from uniun.models.session import DecoderSession

    path = tmp_path / "small.gguf"
    write_bench_gguf(path, SMALL, "Q8_0", tokenizer_gguf=tokenizer_gguf)
    assert main(["models", "import", str(path), "--id", "bench-fill"]) == 0
    assert store.manifest("bench-fill")["weight_format"] == "gguf-q8_0-nbits"
    tok = DecoderSession.load(store.path("bench-fill"), threads=1).tokenizer
    fillers = range(SMOLLM2_TOKENS, SMALL.vocab)
    assert [tok.decode([i]) for i in fillers] == [f"<fill-{i}>" for i in fillers]
    text = "".join(f"<fill-{i}>" for i in fillers) + " and words around them"
    assert max(tok(text, add_special_tokens=False)["input_ids"]) < SMOLLM2_TOKENS


def test_the_file_says_what_the_shape_says(tmp_path: Path, tokenizer_gguf: Path) -> None:
    """What the importer reads back: the shape's numbers, Llama 3's RoPE factors, a tied
    embedding; and the same seed gives the same bytes, another seed others."""
    import gguf

    from uniun.models.convert.gguf_families import read_config

    a, b, c = (tmp_path / f"{n}.gguf" for n in "abc")
    for path, seed in ((a, 5), (b, 5), (c, 6)):
        write_bench_gguf(path, SMALL_B, "Q4_1", seed=seed, tokenizer_gguf=tokenizer_gguf)
    assert _sha(a) == _sha(b) != _sha(c)
    assert not list(tmp_path.glob("*.partial"))
    config = read_config(gguf.GGUFReader(str(a)))
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size,
            config.num_attention_heads, config.num_key_value_heads, config.head_dim,
            config.vocab_size, config.rope_theta, config.max_position_embeddings) == \
        (3, 128, 256, 2, 1, 64, SMALL_B.vocab, 500_000.0, 4096)
    assert config.tie_word_embeddings
    factors = config.rope_freq_factors
    assert factors is not None and len(factors) == 32
    assert factors[0] == 1.0 and factors[-1] == 32.0  # high frequencies kept, low scaled
    assert list(factors) == sorted(factors)

    from gguf.quants import dequantize

    embd = next(t for t in gguf.GGUFReader(str(a)).tensors if t.name == "token_embd.weight")
    rows = dequantize(embd.data, embd.tensor_type).reshape(SMALL_B.vocab, SMALL_B.hidden)
    real, filler = rows[:SMOLLM2_TOKENS].std(), rows[SMOLLM2_TOKENS:].std()
    assert abs(real * SMALL_B.hidden ** 0.5 - 1) < 0.05  # unit-size logits after RMSNorm
    assert abs(filler / real - 0.5) < 0.05  # filler ids: half the spread, rarely picked


def test_make_bench_writes_once_imports_once_and_remakes_a_damaged_file(
        store: ModelStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "make-bench", "1b"]) == 0
    out = capsys.readouterr().out
    gguf = store.root / ".sources" / "bench" / "bench-llama-1b-q4_1.gguf"
    assert gguf.is_file() and "bench-llama-1b-q4_1" in out
    manifest = store.manifest("bench-llama-1b-q4_1")
    assert manifest["source"]["from"] == str(gguf) and manifest["architecture"] == "llama"
    made = (gguf.stat().st_mtime_ns, manifest["created"])
    assert model_files("bench-llama-1b-q4_1", need_gguf=True).gguf == gguf  # for llama.cpp

    assert main(["models", "make-bench", "1b"]) == 0  # again: nothing to do
    assert "already imported" in capsys.readouterr().out
    assert (gguf.stat().st_mtime_ns, store.manifest("bench-llama-1b-q4_1")["created"]) == made

    original = _sha(gguf)
    with gguf.open("r+b") as f:  # damaged on disk: written again, the same bytes
        f.seek(-100, os.SEEK_END)
        f.write(b"\xff" * 50)
    assert main(["models", "make-bench", "1b"]) == 0
    assert _sha(gguf) == original and gguf.stat().st_mtime_ns != made[0]
    assert "already imported" in capsys.readouterr().out  # the import was of those bytes
    assert store.manifest("bench-llama-1b-q4_1")["source"]["sha256"] == original


def test_make_bench_seed_and_format_name_their_model(
        store: ModelStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "make-bench", "3b", "--format", "q8_0", "--seed", "4"]) == 0
    assert store.manifest("bench-llama-3b-q8_0-seed4")["weight_format"] == "gguf-q8_0-nbits"
    assert not store.has("bench-llama-1b-q4_1")


def test_a_format_only_llama_cpp_makes_needs_the_peer(
        store: ModelStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "make-bench", "1b", "--format", "q4_k_m"]) == 2
    assert "--peer-python" in capsys.readouterr().err
    assert not (store.root / ".sources" / "bench").exists()
    with pytest.raises(SystemExit):
        main(["models", "make-bench", "1b", "--format", "q2_k"])  # not a format we offer
