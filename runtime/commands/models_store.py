"""``models pull | import | build-tiny | list | rm``: the store's own commands.

Thin wrappers: parse, call ``uniun.models``, print, turn store errors into a one-line
message and exit code 1 (a person reads these, not a program — except ``list --json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

EXIT_ERROR = 1


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Print ``ModelStoreError`` as ``error: ...`` instead of a traceback."""

    def run(args: argparse.Namespace) -> int:
        from uniun.models.store import ModelStoreError

        try:
            return func(args)
        except ModelStoreError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_ERROR

    return run


def _pull(args: argparse.Namespace) -> int:
    from uniun.models.convert.pull import pull

    path = pull(args.model_id, force=args.force)
    print(f"{args.model_id}: {path}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from uniun.models.convert.hf_import import import_folder

    path = import_folder(args.folder, model_id=args.id, force=args.force)
    print(f"{path.name}: {path}")
    return 0


def _build_tiny(args: argparse.Namespace) -> int:
    from uniun.models.convert.tiny import build_tiny

    path = build_tiny(args.seed, force=args.force)
    print(f"tiny-{args.seed}: {path}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from uniun.models.store import ModelStore

    store = ModelStore()
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
    from uniun.models.store import ModelStore

    ModelStore().remove(args.model_id)
    print(f"removed {args.model_id}")
    return 0


def register_models(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pull", help="download and convert a known model into the store")
    p.add_argument("model_id", help="e.g. smollm2-135m-instruct")
    p.add_argument("--force", action="store_true", help="convert again even if installed")
    p.set_defaults(func=_guarded(_pull))

    p = sub.add_parser("import", help="validate and register an HF-style ONNX decoder folder")
    p.add_argument("folder", help="folder with model.onnx, config.json, tokenizer.json, ...")
    p.add_argument("--id", help="model id to register it as (default: the folder's name)")
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
