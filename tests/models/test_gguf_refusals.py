"""A GGUF with missing, zero or absurd numbers is refused with a GgufError naming them.

Real GGUF files written by the ``gguf`` package's writer (tests/models/gguf_fixtures.py)
with one field changed, or with one tensor description patched in the file's bytes;
each is imported into an empty store, which must stay empty.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.models.gguf_fixtures import write_tiny_gguf
from uniun.models.convert.gguf_import import GgufError, import_gguf
from uniun.models.store import ModelStore

HEADS, KV, HEAD_DIM, HIDDEN = 4, 2, 64, 64  # the fixture's llama


def _refused(tmp_path: Path, path: Path, match: str) -> str:
    store = ModelStore(tmp_path / "store")
    with pytest.raises(GgufError, match=match) as info:
        import_gguf(path, store, "refused", progress=False)
    assert not store.root.exists() or not [p for p in store.root.iterdir()
                                           if not p.name.endswith(".lock")]
    return str(info.value)


@pytest.mark.parametrize(("fields", "match"), [
    ({"llama.attention.head_count": None}, r"llama\.attention\.head_count is missing"),
    ({"llama.attention.head_count": 0}, r"llama\.attention\.head_count is 0; must be 1\.\.1024"),
    ({"llama.block_count": 1_000_000_000}, r"llama\.block_count is 1000000000; must be"),
    ({"llama.embedding_length": -64}, r"llama\.embedding_length is -64"),
    ({"llama.feed_forward_length": None}, r"llama\.feed_forward_length is missing"),
    ({"llama.attention.head_count": "four"}, r"llama\.attention\.head_count must be an integer"),
    ({"llama.attention.head_count_kv": 3}, r"head_count 4 is not a multiple of .*head_count_kv 3"),
    ({"llama.attention.key_length": 63}, r"head size 63 .* must be even"),
    ({"llama.attention.value_length": 32}, r"value_length 32 differs from the key length 64"),
    ({"llama.context_length": 0}, r"llama\.context_length is 0"),
    ({"llama.attention.layer_norm_rms_epsilon": float("nan")},
     r"layer_norm_rms_epsilon must be a number"),
    ({"llama.vocab_size": 5}, r"more than llama\.vocab_size 5"),
    ({"tokenizer.ggml.eos_token_id": 1_000_000},
     r"tokenizer\.ggml\.eos_token_id is 1000000; the vocabulary has"),
    ({"general.architecture": 5}, r"architecture 5 is not supported"),
    ({"tokenizer.ggml.tokens": None}, r"tokenizer\.ggml\.tokens is missing or empty"),
    # The numbers are each plausible, but the tensors say otherwise:
    ({"llama.attention.head_count": 8},
     r"tensor 'blk\.0\.attn_q\.weight' has shape \[256, 64\].*implies \[512, 64\]"),
    ({"llama.block_count": 3}, r"tensor\(s\) missing, e\.g\. blk\.2\.attn_norm\.weight"),
    ({"llama.block_count": 1}, r"layer\(s\) 1 exist, but llama\.block_count is 1"),
])
def test_a_bad_number_is_refused_by_name(tmp_path: Path, fields: dict, match: str) -> None:
    path = write_tiny_gguf(tmp_path / "bad.gguf", "llama", "Q8_0", fields=fields)
    _refused(tmp_path, path, match)


def test_every_problem_is_named_at_once(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "bad.gguf", "llama", "Q8_0",
                           fields={"llama.attention.head_count": 0,
                                   "llama.embedding_length": None})
    message = _refused(tmp_path, path, "head_count is 0")
    assert "llama.embedding_length is missing" in message


def _tensor_info(data: bytes, name: str) -> int:
    """Offset of ``name``'s n_dims field in the tensor descriptions (after its name)."""
    encoded = name.encode()
    at = data.index(struct.pack("<Q", len(encoded)) + encoded)
    return at + 8 + len(encoded)


def _patch(path: Path, name: str, *, dims: list[int] | None = None,
           kind: int | None = None, offset: int | None = None) -> Path:
    """Rewrite one tensor description in place (same number of dimensions)."""
    data = bytearray(path.read_bytes())
    at = _tensor_info(bytes(data), name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    if dims is not None:
        assert len(dims) == n_dims
        struct.pack_into(f"<{n_dims}Q", data, at + 4, *dims)
    if kind is not None:
        struct.pack_into("<I", data, at + 4 + 8 * n_dims, kind)
    if offset is not None:
        struct.pack_into("<Q", data, at + 8 + 8 * n_dims, offset)
    path.write_bytes(bytes(data))
    return path


def test_a_truncated_file_names_the_tensor_whose_bytes_are_missing(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "cut.gguf", "llama", "Q8_0")
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    _refused(tmp_path, path, r"tensor 'output\.weight': its data would end at byte \d+, "
                             rf"past the end of the file \({len(data) - 100} bytes\)")


@pytest.mark.parametrize(("patch", "match"), [
    ({"offset": 1 << 40}, r"tensor 'blk\.0\.ffn_up\.weight': its data would end .* past the end"),
    ({"dims": [HIDDEN, 0]}, r"tensor 'blk\.0\.ffn_up\.weight' has a zero or missing dimension"),
    ({"dims": [1 << 32, 1 << 32]}, r"tensor 'blk\.0\.ffn_up\.weight' claims \d+ elements"),
    ({"kind": 999}, r"tensor 'blk\.0\.ffn_up\.weight' has an unknown type number 999"),
    ({"dims": [48, 256]}, (r"tensor 'blk\.0\.ffn_up\.weight': rows of 48 values do not "
                           r"fill whole Q8_0 blocks of 32")),
])
def test_a_bad_tensor_description_is_refused_by_name(tmp_path: Path, patch: dict,
                                                     match: str) -> None:
    path = _patch(write_tiny_gguf(tmp_path / "bad.gguf", "llama", "Q8_0"),
                  "blk.0.ffn_up.weight", **patch)
    _refused(tmp_path, path, match)


def test_tensors_that_share_bytes_are_refused(tmp_path: Path) -> None:
    import gguf

    path = write_tiny_gguf(tmp_path / "overlap.gguf", "llama", "Q8_0")
    reader = gguf.GGUFReader(str(path))
    up = next(t for t in reader.tensors if t.name == "blk.0.ffn_up.weight")
    shared = up.data_offset - reader.data_offset
    del reader
    _patch(path, "blk.0.ffn_gate.weight", offset=shared)
    _refused(tmp_path, path, r"tensors 'blk\.0\.ffn_\w+\.weight' and "
                             r"'blk\.0\.ffn_\w+\.weight' overlap")


def test_a_tensor_of_nans_is_refused(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    path = write_tiny_gguf(tmp_path / "nan.gguf", "llama", "Q8_0")
    reader = gguf.GGUFReader(str(path))
    norm = next(t for t in reader.tensors if t.name == "blk.1.attn_norm.weight")
    at, size = norm.data_offset, norm.n_bytes
    del reader
    data = bytearray(path.read_bytes())
    data[at:at + size] = np.full(size // 4, np.nan, np.float32).tobytes()
    path.write_bytes(bytes(data))
    _refused(tmp_path, path, r"tensor 'blk\.1\.attn_norm\.weight' holds infinite or NaN")


def test_the_cli_says_what_is_wrong_without_a_traceback(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "bad.gguf", "llama", "Q8_0",
                           fields={"llama.attention.head_count": 0})
    out = subprocess.run([sys.executable, "-m", "uniun.runtime", "models", "import", str(path)],
                         capture_output=True, text=True, timeout=300, check=False,
                         env={**os.environ, "UNIUN_MODELS": str(tmp_path / "m")})
    assert out.returncode == 1
    assert "llama.attention.head_count is 0" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_a_sound_file_of_each_family_passes_the_checks(tmp_path: Path, arch: str) -> None:
    from uniun.models.convert.gguf_import import _reader, check_gguf

    assert check_gguf(_reader(write_tiny_gguf(tmp_path / "ok.gguf", arch, "Q4_K"))) == arch


def test_smollm2s_real_gguf_passes_the_checks() -> None:
    """The file ``models pull`` fetches (cached in the shared store's sources)."""
    from tests.models_cache import shared_store
    from uniun.models.convert.gguf_import import _reader, check_gguf
    from uniun.models.convert.pull import source_file

    assert check_gguf(_reader(source_file("smollm2-135m-instruct", shared_store(),
                                          progress=False))) == "llama"


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_damaged_headers_are_refused_or_imported_never_a_traceback(tmp_path: Path,
                                                                   arch: str) -> None:
    """Random damage to the metadata and tensor descriptions (fixed seed): every file is
    either imported or refused with a GgufError; nothing else escapes."""
    import random

    import gguf

    good = write_tiny_gguf(tmp_path / "ok.gguf", arch, "Q8_0")
    src = good.read_bytes()
    header = gguf.GGUFReader(str(good)).data_offset
    rng = random.Random(7)
    outcomes = {"imported": 0, "refused": 0}
    for i in range(150):
        data = bytearray(src)
        for _ in range(rng.choice((1, 2, 4))):
            at = rng.randrange(0, header - 4)
            data[at:at + 4] = rng.choice((bytes([rng.randrange(256)]) + data[at + 1:at + 4],
                                          b"\0\0\0\0", b"\xff\xff\xff\x7f",
                                          struct.pack("<I", 1)))
        path = tmp_path / f"damaged-{i}.gguf"
        path.write_bytes(bytes(data))
        try:
            import_gguf(path, ModelStore(tmp_path / "store"), f"d{i}", progress=False)
            outcomes["imported"] += 1
        except GgufError:
            outcomes["refused"] += 1
        path.unlink()
    assert outcomes["refused"] > 0, outcomes
