"""``models pull | import | build-tiny | list | rm``: the store's own commands.

Thin wrappers: parse, call ``uniun.models``, print, turn store errors into a one-line
message and exit code 1 (a person reads these, not a program — except ``list --json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from uniun.models.store import ModelStore, ModelStoreError
from uniun.runtime.paths import models_dir

EXIT_ERROR = 1


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Print ``ModelStoreError`` as ``error: ...`` instead of a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except ModelStoreError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_ERROR

    return run


def _store() -> ModelStore:
    return ModelStore(models_dir())


def _pull(args: argparse.Namespace) -> int:
    from uniun.models.convert.pull import PULLABLE
    from uniun.models.convert.recipes import RECIPES, ensure_model

    if args.model_id not in PULLABLE and args.model_id not in RECIPES:
        raise ModelStoreError(f"{args.model_id!r} cannot be pulled; known: "
                              f"{', '.join(sorted(set(PULLABLE) | set(RECIPES)))}")
    path = ensure_model(args.model_id, _store(), rebuild=args.force)
    print(f"{args.model_id}: {path}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from pathlib import Path

    if Path(args.folder).suffix.lower() == ".gguf":
        return _import_gguf(args)
    from uniun.models.convert.hf_import import import_folder

    path = import_folder(args.folder, _store(), model_id=args.id, force=args.force)
    print(f"{path.name}: {path}")
    return 0


def _import_gguf(args: argparse.Namespace) -> int:
    """Convert a GGUF file (llama, qwen2, gemma3) into the store; print what it became."""
    import time

    from uniun.models.convert.gguf_import import import_gguf
    from uniun.models.onnx_ops import op_types

    started = time.monotonic()
    store = _store()
    path = import_gguf(args.folder, store, model_id=args.id, force=args.force,
                       progress=sys.stderr.isatty())
    manifest = store.manifest(path.name)
    size = sum(f["size"] for f in manifest.get("files", {}).values())
    ops = op_types(path / "model.onnx")
    kernels = " and ".join(k for k in ("QMatMul", "MatMulNBits") if k in ops) or "float32"
    print(f"{path.name}: {path}\n  {manifest.get('architecture')}, weights "
          f"{manifest.get('weight_format')} (kept exactly, run by {kernels}; "
          f"5-bit codes stored in 8 bits), {size / 1e6:.1f} MB, "
          f"{time.monotonic() - started:.1f} s")
    return 0


def _build_tiny(args: argparse.Namespace) -> int:
    from uniun.models.convert.recipes import ensure_model

    path = ensure_model(f"tiny-{args.seed}", _store(), rebuild=args.force)
    print(f"tiny-{args.seed}: {path}")
    return 0


def _list(args: argparse.Namespace) -> int:
    store = _store()
    infos = store.list()
    if args.json:
        print(json.dumps({"store": str(store.root),
                          "models": [info.to_json() for info in infos]}, indent=2))
        return 0
    if not infos:
        print(f"no models in {store.root}")
        return 0
    width = max(len(i.model_id) for i in infos)
    for info in infos:
        source = info.source.get("package") or info.source.get("type", "?")
        print(f"{info.model_id:<{width}}  {info.size_bytes / 1e6:8.1f} MB  "
              f"{info.weight_format:<10}  {source}")
    return 0


def _rm(args: argparse.Namespace) -> int:
    _store().remove(args.model_id)
    print(f"removed {args.model_id}")
    return 0


def register_models(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pull", help="download and convert a known model into the store")
    p.add_argument("model_id", help="e.g. smollm2-135m-instruct")
    p.add_argument("--force", action="store_true", help="convert again even if installed")
    p.set_defaults(func=_guarded(_pull))

    p = sub.add_parser("import", help="convert a GGUF file, or validate and register an "
                                      "HF-style ONNX decoder folder")
    p.add_argument("folder", help="FILE.gguf (llama, qwen2, gemma3), or a folder with "
                                  "model.onnx, config.json, tokenizer.json, ...")
    p.add_argument("--id", help="model id to register it as (default: the file's or "
                                "folder's name)")
    p.add_argument("--force", action="store_true", help="replace an installed model")
    p.set_defaults(func=_guarded(_import))

    p = sub.add_parser("build-tiny", help="build the tiny synthetic test model tiny-SEED")
    p.add_argument("--seed", type=int, default=1, help="weight seed (default 1)")
    p.add_argument("--force", action="store_true", help="rebuild even if installed")
    p.set_defaults(func=_guarded(_build_tiny))

    p = sub.add_parser("list", help="list installed models")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(func=_guarded(_list))

    p = sub.add_parser("rm", help="remove a model from the store")
    p.add_argument("model_id")
    p.set_defaults(func=_guarded(_rm))
