"""Models the store knows how to make, and ``ensure_model``: the one way to get a model.

A *recipe* installs one model id into a :class:`~uniun.models.store.ModelStore` under the
store's lock for that id: the tiny test decoders (``tiny-N``, built from seed N), the
pulled SmolLM2 decoder, the pulled MiniLM embedding model. Recipes are named here as
``"module:function"`` and imported only when one runs, so that asking "can a job run on
this id?" (the scheduler's front, for every submit) does not load onnx, gguf and numpy.

Every converter carries its own version number; a stored model made by an older version
of its converter is rebuilt the next time it is ensured, so a change to the decoder graph
rebuilds decoders only, not the embedding model.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path

from loguru import logger

from uniun.models.store import (
    ModelCorrupt,
    ModelNotFound,
    ModelStore,
    ModelStoreError,
    check_model_id,
)

__all__ = ["RECIPES", "ensure_model", "can_run_jobs", "known_model_ids", "builder_version"]

Recipe = Callable[[ModelStore, str], None]

_TINY_RE = re.compile(r"^tiny-([0-9]{1,6})$")
_TINY_RECIPE = "uniun.models.convert.tiny:install_tiny_id"

# id -> "module:function(store, model_id)"; each installs the model under its lock.
RECIPES: dict[str, str] = {
    "smollm2-135m-instruct": "uniun.models.convert.pull:install_pulled",
    "gemma3-270m": "uniun.models.convert.pull:install_pulled",
    "all-minilm-l6-v2": "uniun.models.convert.embedding:install_pulled",
}

# Recipes that make something other than a decoder (no job can run on these).
NON_DECODER_RECIPES = frozenset({"all-minilm-l6-v2"})

# kind -> "module:NAME" of the converter version constant for models of that kind.
_VERSIONS: dict[str, str] = {
    "decoder": "uniun.models.convert.onnx_decoder:BUILDER_VERSION",
    "embedding": "uniun.models.convert.embedding:CONVERTER_VERSION",
}


def _resolve(ref: str) -> object:
    module_name, name = ref.split(":")
    return getattr(importlib.import_module(module_name), name)


def _recipe(model_id: str) -> Recipe | None:
    """How to build ``model_id`` from nothing, or None (imported models)."""
    if _TINY_RE.fullmatch(model_id):
        return _resolve(_TINY_RECIPE)  # type: ignore[return-value]
    if model_id in RECIPES:
        return _resolve(RECIPES[model_id])  # type: ignore[return-value]
    return None


def can_run_jobs(model_id: str, store: ModelStore) -> bool:
    """Whether a job may name ``model_id``: a decoder installed, or one the store can make.

    An installed model answers by its manifest's kind (imported decoders included); the
    embedding model is in the store too, but a job on it could only fail later. An id that
    is not a valid store name is simply not a model a job can run on.
    """
    try:
        check_model_id(model_id)
    except ModelStoreError:
        return False
    if _TINY_RE.fullmatch(model_id):
        return True
    if store.has(model_id):
        try:
            return store.manifest(model_id).get("kind", "decoder") == "decoder"
        except (ModelStoreError, ValueError, OSError):  # unreadable: not one to run on
            return False
    return model_id in RECIPES and model_id not in NON_DECODER_RECIPES


# Pullable base models: no chat template, so producers give them completion prompts.
BASE_MODELS = frozenset({"gemma3-270m"})


def is_base_model(model_id: str, store: ModelStore) -> bool:
    """Whether ``model_id`` is a base model (no chat template): a known one, or an
    installed folder whose tokenizer config has none (e.g. an imported base GGUF)."""
    if model_id in BASE_MODELS:
        return True
    try:
        folder = store.path(model_id)
    except ModelStoreError:
        return False
    import json

    try:
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return not cfg.get("chat_template") and not (folder / "chat_template.jinja").is_file()


def known_model_ids() -> list[str]:
    return [*sorted(RECIPES), "tiny-N (N = seed)"]


def builder_version(kind: str) -> int:
    """The version of the converter that makes models of ``kind``."""
    return int(_resolve(_VERSIONS.get(kind, _VERSIONS["decoder"])))  # type: ignore[call-overload]


def _up_to_date(store: ModelStore, model_id: str) -> bool:
    manifest = store.manifest(model_id)
    return manifest.get("builder_version") == builder_version(manifest.get("kind", "decoder"))


def ensure_model(model_id: str, store: ModelStore, *, rebuild: bool = False) -> Path:
    """The verified folder of ``model_id``, building or pulling it first if needed.

    A corrupt install of a model the store can make is removed and made again; a
    corrupt imported model raises :class:`ModelCorrupt` (we cannot remake it). An id
    that is neither installed nor known raises :class:`ModelNotFound`. ``rebuild``
    removes an installed model the store can make and makes it again.
    """
    check_model_id(model_id)
    recipe = _recipe(model_id)
    if rebuild:
        if recipe is None:
            raise ModelStoreError(f"{model_id!r} was imported; the store cannot rebuild it "
                                  f"(known: {', '.join(known_model_ids())})")
        if store.folder(model_id).exists():
            store.remove(model_id)
    try:
        path = store.path(model_id)
        if recipe is None or _up_to_date(store, model_id):
            return path
        logger.info("model {} was built by an older converter; rebuilding it", model_id)
    except ModelCorrupt as exc:
        if recipe is None:
            raise ModelCorrupt(f"{exc}; re-import it with `uniun-runtime models import DIR`") \
                from exc
        logger.warning("{}; rebuilding it", exc)
    except ModelNotFound:
        if recipe is None:
            raise ModelNotFound(
                f"unknown model {model_id!r}: not in the store ({store.root}) and not one "
                f"the store can make ({', '.join(known_model_ids())}); "
                "import it with `uniun-runtime models import DIR`") from None
    with store.lock(model_id):
        try:  # another process may have built it while we waited for the lock
            path = store.path(model_id)
            if _up_to_date(store, model_id):
                return path
        except ModelStoreError:
            pass
        store.clean_stale(model_id)
        recipe(store, model_id)
    return store.path(model_id)
