"""``models import DIR``: register an existing Hugging-Face-style ONNX decoder export.

The layout optimum and onnxruntime-genai write: ``model.onnx`` (+ external data),
``config.json``, ``tokenizer.json``, ``tokenizer_config.json`` with a chat template
(or ``chat_template.jinja``). Before anything is copied the folder is checked against
the I/O contract our decoder session relies on (see ``onnx_decoder``): the input and
output names, float32 KV tensors whose static dims match ``config.json``, external
data files present, a tokenizer that loads. Every problem found is listed in one
error, so a person fixes the folder in one go; the store is unchanged on error.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from loguru import logger

from uniun.models.store import ModelStore, ModelStoreError, check_model_id

REQUIRED_CONFIG = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")


class ImportRejected(ModelStoreError):
    """The folder does not fit the decoder contract; ``problems`` lists each reason."""

    def __init__(self, folder: Path, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"cannot import {folder}: " + "; ".join(problems))


def _check_config(folder: Path, problems: list[str]) -> dict[str, Any] | None:
    path = folder / "config.json"
    if not path.is_file():
        problems.append("missing config.json")
        return None
    try:
        cfg = json.loads(path.read_text())
    except ValueError as exc:
        problems.append(f"config.json is not valid JSON ({exc})")
        return None
    missing = [k for k in REQUIRED_CONFIG if not isinstance(cfg.get(k), int)]
    if missing:
        problems.append(f"config.json lacks integer {', '.join(missing)}")
        return None
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    return cfg


def _check_tokenizer(folder: Path, problems: list[str]) -> None:
    if not (folder / "tokenizer.json").is_file():
        problems.append("missing tokenizer.json (a fast tokenizer is required)")
    else:
        from tokenizers import Tokenizer

        try:
            Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # noqa: BLE001 - any parse failure is the folder's fault
            problems.append(f"tokenizer.json does not load ({exc})")
    tok_cfg_path = folder / "tokenizer_config.json"
    if not tok_cfg_path.is_file():
        problems.append("missing tokenizer_config.json")
        return
    try:
        tok_cfg = json.loads(tok_cfg_path.read_text())
    except ValueError as exc:
        problems.append(f"tokenizer_config.json is not valid JSON ({exc})")
        return
    if not tok_cfg.get("chat_template") and not (folder / "chat_template.jinja").is_file():
        problems.append("no chat template (chat_template in tokenizer_config.json "
                        "or chat_template.jinja)")
    if not tok_cfg.get("eos_token"):
        problems.append("tokenizer_config.json has no eos_token")


def _dims(value: Any) -> list[Any]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def _dim_fits(dims: list[Any], expected: int) -> bool:
    """A symbolic (named or unknown) dim fits anything; a static one must be equal."""
    return not dims or not isinstance(dims[0], int) or dims[0] in (0, expected)


def _check_graph(folder: Path, cfg: dict[str, Any] | None, problems: list[str]) -> None:
    import onnx

    path = folder / "model.onnx"
    if not path.is_file():
        others = sorted(p.name for p in folder.glob("*.onnx"))
        problems.append("missing model.onnx" + (f" (found {', '.join(others)}; merged "
                                               "or split decoders are not supported)"
                                               if others else ""))
        return
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001
        problems.append(f"model.onnx is not a readable ONNX model ({exc})")
        return
    for init in model.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location" and not (folder / entry.value).is_file():
                problems.append(f"external data file {entry.value} is missing")
                break
    inputs = {v.name: v for v in model.graph.input}
    outputs = {v.name: v for v in model.graph.output}
    f32, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    for name in ("input_ids", "attention_mask", "position_ids"):
        if name not in inputs:
            problems.append(f"model.onnx has no input {name}")
        elif inputs[name].type.tensor_type.elem_type != i64:
            problems.append(f"input {name} must be int64")
    if "logits" not in outputs:
        problems.append("model.onnx has no output logits")
    elif cfg and not _dim_fits(_dims(outputs["logits"])[-1:], cfg["vocab_size"]):
        problems.append(f"logits last dim {_dims(outputs['logits'])[-1]} != vocab_size "
                        f"{cfg['vocab_size']} in config.json")
    if cfg is None:
        return
    layers = cfg["num_hidden_layers"]
    want = [cfg["num_key_value_heads"], cfg["head_dim"]]
    for i in range(layers):
        for kind in ("key", "value"):
            for table, name in ((inputs, f"past_key_values.{i}.{kind}"),
                                (outputs, f"present.{i}.{kind}")):
                value = table.get(name)
                if value is None:
                    problems.append(f"model.onnx has no {'input' if table is inputs else 'output'}"
                                    f" {name} (config.json says {layers} layers)")
                    continue
                dims = _dims(value)
                if value.type.tensor_type.elem_type != f32:
                    problems.append(f"{name} must be float32")
                elif len(dims) != 4 or not (_dim_fits([dims[1]], want[0])
                                            and _dim_fits([dims[3]], want[1])):
                    problems.append(f"{name} has shape {dims}, expected [batch, "
                                    f"{want[0]}, seq, {want[1]}] from config.json")
    extra = sorted(n for n in inputs if n.startswith("past_key_values.")
                   and int(n.split(".")[1]) >= layers)
    if extra:
        problems.append(f"model.onnx has KV inputs beyond config.json's {layers} layers "
                        f"({extra[0]} ...)")


def validate_folder(folder: Path) -> dict[str, Any]:
    """Check ``folder`` against the decoder contract; its config, or :class:`ImportRejected`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ImportRejected(folder, ["not a folder"])
    problems: list[str] = []
    cfg = _check_config(folder, problems)
    _check_tokenizer(folder, problems)
    _check_graph(folder, cfg, problems)
    if problems:
        raise ImportRejected(folder, problems)
    assert cfg is not None
    return cfg


def _weight_format(folder: Path) -> str:
    import onnx

    ops = {n.op_type for n in onnx.load(str(folder / "model.onnx"),
                                        load_external_data=False).graph.node}
    if "MatMulNBits" in ops:
        return "nbits"
    if ops & {"MatMulInteger", "DynamicQuantizeMatMul", "QLinearMatMul"}:
        return "int8"
    return "float"


def import_folder(folder: Path | str, store: ModelStore, model_id: str | None = None, *,
                  force: bool = False) -> Path:
    """Validate ``folder`` and copy it into ``store`` as ``model_id`` (default: its name)."""
    folder = Path(folder).expanduser().resolve()
    model_id = check_model_id(model_id or folder.name.lower())
    validate_folder(folder)
    with store.lock(model_id):
        if store.folder(model_id).exists() and not force:
            raise ModelStoreError(f"model {model_id!r} already exists; use --force to "
                                  "replace it or --id to pick another id")
        store.clean_stale(model_id)
        with store.install(model_id, kind="decoder", weight_format=_weight_format(folder),
                           source={"type": "import", "from": str(folder)}) as staging:
            for item in sorted(folder.iterdir()):
                if item.is_file() and not item.name.startswith("."):
                    shutil.copy2(item, staging / item.name)
    logger.info("imported {} as {}", folder, model_id)
    return store.path(model_id)
