"""GGUF -> model folder: ``models import FILE.gguf`` and the pulled GGUF models.

The work is split by concern (docs/models.md "GGUF import"):

- :mod:`~uniun.models.convert.gguf_families`: architecture metadata -> config, tensor
  names -> HF names, llama.cpp's Q/K permutation (llama, qwen2, gemma3);
- :mod:`~uniun.models.convert.gguf_quant`: each tensor type -> float32 or the exact
  ``MatMulNBits`` blocks (the table of types and their mapping);
- :mod:`~uniun.models.convert.gguf_tokenizer`: tokenizer and chat template from the
  metadata.

This module checks a file *before* any work (architecture, tensor types, tokenizer
model, and with :mod:`~uniun.models.convert.gguf_check` the numbers in the metadata and
every tensor's size, place and shape), so a refusal names every problem at once and the
store is never touched; then it reads, builds the graph and writes the folder, with
progress bars.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger

from uniun.models.convert.decoder_spec import BlockQuantized, DecoderConfig, Weight
from uniun.models.convert.gguf_check import checked_reader, field_problems, tensor_problems
from uniun.models.convert.gguf_families import (
    FAMILIES,
    GgufError,
    field,
    hf_name,
    read_config,
    unpermute,
)
from uniun.models.convert.gguf_quant import UnsupportedTensor, to_weight, unsupported_types

__all__ = ["GgufError", "GgufModel", "read_gguf", "convert_gguf", "check_gguf",
           "import_gguf"]


@dataclass
class GgufModel:
    config: DecoderConfig
    weights: dict[str, Weight]
    tokenizer_json: str
    tokenizer_config: dict[str, Any]
    weight_format: str
    metadata: dict[str, Any]


def _reader(path: Path) -> Any:
    try:
        return checked_reader(str(path))
    except GgufError as exc:
        raise GgufError(f"{path}: {exc}") from None
    except (ValueError, OSError, KeyError, IndexError, TypeError, OverflowError,
            UnicodeDecodeError, MemoryError) as exc:
        raise GgufError(f"{path} is not a readable GGUF file ({type(exc).__name__}: "
                        f"{str(exc)[:200]})") from exc


def check_gguf(reader: Any) -> str:
    """Every reason the file cannot be imported, in one :class:`GgufError`; else its arch.

    Architecture, tensor types and tokenizer model first; then the architecture's numbers
    (``gguf_check.field_problems``); when those are sound, the tensors' presence and
    shapes against them (``gguf_check.tensor_problems``).
    """
    problems: list[str] = []
    arch = field(reader, "general.architecture")
    if not isinstance(arch, str) or arch not in FAMILIES:
        problems.append(f"architecture {arch!r} is not supported "
                        f"(supported: {', '.join(FAMILIES)})")
    else:
        problems += field_problems(reader, str(arch))
        if not problems:
            problems += tensor_problems(reader, str(arch), read_config(reader))
    bad = unsupported_types(reader)
    if bad:
        kinds = sorted({b.rsplit("(", 1)[1].rstrip(")") for b in bad})
        problems.append(f"tensor type{'s' if len(kinds) > 1 else ''} {', '.join(kinds)} "
                        f"not supported ({len(bad)} tensors, e.g. {bad[0]})")
    kind = field(reader, "tokenizer.ggml.model")
    if not isinstance(kind, str) or kind not in ("gpt2", "llama"):
        problems.append(f"tokenizer model {kind!r} is not supported (gpt2, llama)")
    if problems:
        raise GgufError("; ".join(problems))
    return str(arch)


def read_weights(reader: Any, config: DecoderConfig, arch: str,
                 progress: Callable[[int], None] | None = None) -> tuple[dict[str, Weight], str]:
    """HF-named weights; the second value names the matrix types found, e.g. 'Q5_0+Q8_0'."""
    from gguf import GGMLQuantizationType as Q

    weights: dict[str, Weight] = {}
    kinds: set[str] = set()
    for t in reader.tensors:
        name = hf_name(arch, t.name)
        kind = Q(t.tensor_type).name
        if name is not None:
            shape = [int(s) for s in reversed(t.shape)]  # GGUF lists dims fastest-first
            try:
                value = to_weight(t.name, kind, t.data, shape)
            except UnsupportedTensor as exc:
                raise GgufError(str(exc)) from exc
            if not _finite(value):
                raise GgufError(f"tensor {t.name!r} holds infinite or NaN values (or scales); "
                                "the file is corrupt")
            if len(shape) == 2:
                kinds.add(kind)
            if FAMILIES[arch].permute_qk and ".self_attn.q_proj." in name:
                value = unpermute(value, config.num_attention_heads)
            elif FAMILIES[arch].permute_qk and ".self_attn.k_proj." in name:
                value = unpermute(value, config.num_key_value_heads)
            weights[name] = value
        if progress:
            progress(1)
    return weights, "+".join(sorted(kinds))


def _finite(weight: Weight) -> bool:
    """No inf or NaN in a float weight, or in a block weight's scales and offsets."""
    if isinstance(weight, BlockQuantized):
        return bool(np.isfinite(weight.scales).all()) and (
            weight.offsets is None or bool(np.isfinite(weight.offsets).all()))
    return bool(np.isfinite(np.asarray(weight)).all())


def read_gguf(path: Path, progress: Callable[[int], None] | None = None, *,
              reader: Any = None) -> GgufModel:
    """Everything the store needs from one GGUF file (weights kept in their blocks).

    ``reader``: an open ``GGUFReader`` of ``path`` (opening one parses every metadata
    array, 262,144 token strings for Gemma: seconds, so it is opened once per import).
    """
    from uniun.models.convert.gguf_tokenizer import read_tokenizer

    reader = reader if reader is not None else _reader(path)
    arch = check_gguf(reader)
    config = read_config(reader)
    try:
        tokenizer_json, tok_cfg = read_tokenizer(reader, arch)
    except GgufError:
        raise
    except Exception as exc:  # the tokenizers library raises plain Exception
        raise GgufError(f"the tokenizer in the metadata cannot be built "
                        f"({type(exc).__name__}: {str(exc)[:200]})") from exc
    weights, fmt = read_weights(reader, config, arch, progress)
    meta = {k: field(reader, k) for k in ("general.name", "general.architecture",
                                           "general.size_label", "general.file_type")}
    return GgufModel(config=config, weights=weights, tokenizer_json=tokenizer_json,
                     tokenizer_config=tok_cfg, weight_format=fmt, metadata=meta)


def convert_gguf(gguf_path: Path, folder: Path, *, progress: bool = True,
                 reader: Any = None) -> str:
    """Convert a GGUF into a model folder (graph + HF side files); its weight format.

    Two bars: reading/repacking tensors, then building layers; saving is one write of
    the external data file.
    """
    from tqdm import tqdm

    from uniun.models.convert.hf_folder import write_hf_files
    from uniun.models.convert.onnx_decoder import build_decoder, save_decoder

    reader = reader if reader is not None else _reader(gguf_path)
    check_gguf(reader)
    with tqdm(total=len(reader.tensors), desc="read GGUF tensors", unit="tensor",
              disable=not progress) as bar:
        model = read_gguf(gguf_path, progress=bar.update, reader=reader)
    del reader
    with tqdm(total=model.config.num_hidden_layers, desc="build ONNX layers", unit="layer",
              disable=not progress) as bar:
        graph = build_decoder(model.config, model.weights, progress=bar.update)
    save_decoder(graph, folder, external=True)
    write_hf_files(folder, model.config, model.tokenizer_json, model.tokenizer_config)
    return f"gguf-{model.weight_format.lower()}-nbits"


def import_gguf(path: Path | str, store: Any, model_id: str | None = None, *,
                force: bool = False, progress: bool = True) -> Path:
    """Check, convert and install ``path`` as ``model_id`` (default: the file's stem).

    A refused file raises :class:`GgufError` before the store is touched; a failure while
    converting leaves nothing behind either (the store's staging folder is removed).
    """
    from uniun.models.convert.onnx_decoder import BUILDER_VERSION
    from uniun.models.store import ModelStoreError, check_model_id, sha256_file

    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise GgufError(f"{path} is not a file")
    model_id = check_model_id(model_id or path.stem.lower().replace("_", "-"))
    reader = _reader(path)
    arch = check_gguf(reader)
    started = time.monotonic()
    with store.lock(model_id):
        if store.folder(model_id).exists() and not force:
            raise ModelStoreError(f"model {model_id!r} already exists; use --force to "
                                  "replace it or --id to pick another id")
        store.clean_stale(model_id)
        meta: dict[str, Any] = {"architecture": arch}
        source = {"type": "gguf", "from": str(path), "sha256": sha256_file(path)}
        with store.install(model_id, kind="decoder", builder_version=BUILDER_VERSION,
                           source=source, weight_format="?", meta=meta) as staging:
            meta["weight_format"] = convert_gguf(path, staging, progress=progress,
                                                 reader=reader)
    logger.info("imported {} ({}) as {} in {:.1f} s", path, arch, model_id,
                time.monotonic() - started)
    return store.path(model_id)
