"""The model store: one folder per model id under a root folder its owner chooses.

Rules of the store (they are what lets a runner trust a folder without re-checking it
by hand):

- A model folder is complete if and only if it holds ``uniun-manifest.json``. The
  manifest is written last, inside a staging folder, and the staging folder is renamed
  into place in one step — so a reader sees either no model or a whole one, never half.
- The manifest lists every file with its size and sha256. :meth:`ModelStore.path`
  verifies them (once per process per unchanged file), so a truncated or altered file
  raises :class:`ModelCorrupt` instead of being loaded; :func:`ensure_model` then
  (in ``convert.recipes``) removes the folder and builds it again when it knows how.
- Installs of one id are serialised by a lock file, so two processes asking for the
  same model build it once.

Model ids are short lowercase names (``smollm2-135m-instruct``, ``tiny-1``). This module
only keeps models; :mod:`uniun.models.convert.recipes` knows how to make some of them
(``ensure_model``), and others arrive through ``models import``. The root is a parameter:
the runtime passes ``$UNIUN_MODELS`` (default ``$UNIUN_HOME/models``), tests a folder of
their own.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from uniun.protocol.jobmap import MODEL_ID_RE

MANIFEST_NAME = "uniun-manifest.json"
MANIFEST_VERSION = 1
_ID_RE = MODEL_ID_RE  # the wire refuses the same names (invalid_field model_id)


# (path, size, mtime_ns) -> sha256 already verified in this process: hashing 200 MB
# takes a while, and an unchanged file need not be hashed twice.
_VERIFIED: dict[tuple[str, int, int], str] = {}


class ModelStoreError(Exception):
    """Something about a stored model is wrong; the message says what and what to do."""


class ModelNotFound(ModelStoreError):
    """No complete model with that id is in the store."""


class ModelCorrupt(ModelStoreError):
    """A stored file is missing, truncated or altered (size or sha256 mismatch)."""


@dataclass(frozen=True)
class ModelInfo:
    """One line of ``models list``."""

    model_id: str
    path: Path
    kind: str
    source: dict[str, Any]
    weight_format: str
    size_bytes: int
    created: float

    def to_json(self) -> dict[str, Any]:
        return {"id": self.model_id, "path": str(self.path), "kind": self.kind,
                "source": self.source, "weight_format": self.weight_format,
                "size_bytes": self.size_bytes, "created": self.created}


def check_model_id(model_id: str) -> str:
    """Return ``model_id`` if it is a valid store name (no paths, no dots first)."""
    if not isinstance(model_id, str) or not _ID_RE.fullmatch(model_id):
        raise ModelStoreError(
            f"invalid model id {model_id!r}: use 1-64 characters a-z 0-9 . _ - "
            "starting with a letter or digit")
    return model_id


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class ModelStore:
    """The folder of models; every method is safe to call from several processes."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    # -- reading ----------------------------------------------------------------------
    def folder(self, model_id: str) -> Path:
        """Where ``model_id`` lives (whether or not it is installed)."""
        return self.root / check_model_id(model_id)

    def has(self, model_id: str) -> bool:
        """True if a complete (manifest-bearing) install exists; does not hash files."""
        return (self.folder(model_id) / MANIFEST_NAME).is_file()

    def manifest(self, model_id: str) -> dict[str, Any]:
        path = self.folder(model_id) / MANIFEST_NAME
        if not path.is_file():
            raise ModelNotFound(
                f"model {model_id!r} is not in the store ({self.root}); "
                f"try `uniun-runtime models pull {model_id}` or `models import DIR`")
        try:
            manifest = json.loads(path.read_text())
            manifest["files"]  # presence check: a manifest without files is corrupt
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelCorrupt(f"model {model_id!r}: unreadable manifest {path}: {exc}") from exc
        return manifest

    def verify(self, model_id: str) -> None:
        """Check every file in the manifest by size and sha256; raise :class:`ModelCorrupt`."""
        folder = self.folder(model_id)
        for name, meta in self.manifest(model_id)["files"].items():
            path = folder / name
            try:
                stat = path.stat()
            except FileNotFoundError:
                raise ModelCorrupt(f"model {model_id!r}: file {name} is missing") from None
            if stat.st_size != meta["size"]:
                raise ModelCorrupt(f"model {model_id!r}: file {name} has {stat.st_size} bytes, "
                                   f"the manifest says {meta['size']} (truncated or altered)")
            key = (str(path), stat.st_size, stat.st_mtime_ns)
            if _VERIFIED.get(key) == meta["sha256"]:
                continue
            if sha256_file(path) != meta["sha256"]:
                raise ModelCorrupt(f"model {model_id!r}: file {name} fails its sha256 check "
                                   "(altered or partly written)")
            _VERIFIED[key] = meta["sha256"]

    def path(self, model_id: str, *, verify: bool = True) -> Path:
        """The folder of a complete, checksum-verified model; raises if absent or corrupt."""
        self.manifest(model_id)
        if verify:
            self.verify(model_id)
        return self.folder(model_id)

    def list(self) -> list[ModelInfo]:
        """Complete models, sorted by id (incomplete or foreign folders are skipped)."""
        infos: list[ModelInfo] = []
        if not self.root.is_dir():
            return infos
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith(".") or not (entry / MANIFEST_NAME).is_file():
                continue
            try:
                m = self.manifest(entry.name)
            except ModelStoreError as exc:
                logger.warning("skipping {}: {}", entry, exc)
                continue
            infos.append(ModelInfo(
                model_id=entry.name, path=entry, kind=m.get("kind", "decoder"),
                source=m.get("source", {}), weight_format=m.get("weight_format", "?"),
                size_bytes=sum(int(f["size"]) for f in m["files"].values()),
                created=float(m.get("created", 0.0))))
        return infos

    # -- writing ----------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, model_id: str) -> Iterator[None]:
        """Exclusive, cross-process lock for installing or removing ``model_id``."""
        self.root.mkdir(parents=True, exist_ok=True)
        lock_path = self.root / f".{check_model_id(model_id)}.lock"
        with lock_path.open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def install(self, model_id: str, *, kind: str, source: dict[str, Any],
                weight_format: str, builder_version: int | None = None,
                meta: dict[str, Any] | None = None) -> Iterator[Path]:
        """Yield an empty staging folder; on a clean exit, publish it as ``model_id``.

        The caller writes the model files into the staging folder. On success the
        manifest (files, sizes, sha256, I/O contract) is written last and the folder is
        renamed into place, replacing any previous install. On an exception the staging
        folder is deleted and the store is unchanged. ``meta`` entries are added to the
        manifest when the block ends, so a converter can record what it decided
        (e.g. ``meta["weight_format"]``). ``builder_version``: the version of the converter
        that made it (a newer converter rebuilds older models). Call it while holding
        :meth:`lock`.
        """
        final = self.folder(model_id)
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f".staging-{model_id}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            yield staging
            manifest = {"manifest_version": MANIFEST_VERSION, "id": model_id, "kind": kind,
                        "builder_version": builder_version,
                        "source": source, "weight_format": weight_format,
                        "created": time.time(), **(meta or {})}
            if (staging / "model.onnx").is_file():
                manifest["io"] = io_contract(staging / "model.onnx")
            manifest["files"] = {
                p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)}
                for p in sorted(staging.iterdir()) if p.is_file() and p.name != MANIFEST_NAME}
            tmp = staging / (MANIFEST_NAME + ".tmp")
            tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
            os.replace(tmp, staging / MANIFEST_NAME)
            if final.exists():
                self._discard(final)
            os.replace(staging, final)
            logger.info("installed model {} at {}", model_id, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def remove(self, model_id: str) -> None:
        """Delete ``model_id`` (complete or not); raises :class:`ModelNotFound` if absent."""
        folder = self.folder(model_id)
        with self.lock(model_id):
            if not folder.exists():
                raise ModelNotFound(f"model {model_id!r} is not in the store ({self.root})")
            self._discard(folder)
        logger.info("removed model {}", model_id)

    def _discard(self, folder: Path) -> None:
        """Rename away first (one atomic step), then delete at leisure."""
        trash = self.root / f".trash-{folder.name}-{uuid.uuid4().hex[:8]}"
        os.replace(folder, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def clean_stale(self, model_id: str) -> None:
        """Remove staging/trash leftovers of ``model_id`` (call under :meth:`lock`).

        Only ``.staging-<id>-<8 hex>`` and ``.trash-<id>-<8 hex>`` of exactly this id: a
        glob on ``.staging-foo-*`` would also match ``.staging-foo-bar-1a2b3c4d``, the
        folder another process is filling right now under ``foo-bar``'s lock.
        """
        if not self.root.is_dir():
            return
        for leftover in self.root.iterdir():
            if _leftover_of(leftover.name) == check_model_id(model_id):
                shutil.rmtree(leftover, ignore_errors=True)


_LEFTOVER_RE = re.compile(r"\.(?:staging|trash)-(.+)-[0-9a-f]{8}")


def _leftover_of(name: str) -> str | None:
    """The model id a staging or trash folder name belongs to, else None."""
    m = _LEFTOVER_RE.fullmatch(name)
    return m.group(1) if m else None


def io_contract(onnx_path: Path) -> dict[str, Any]:
    """Names, element types and shapes (symbolic dims as strings) of a graph's I/O."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)

    def describe(values: Any) -> dict[str, Any]:
        out = {}
        for v in values:
            t = v.type.tensor_type
            dims = [d.dim_param or d.dim_value for d in t.shape.dim]
            out[v.name] = {"dtype": onnx.TensorProto.DataType.Name(t.elem_type).lower(),
                           "shape": dims}
        return out

    return {"inputs": describe(model.graph.input), "outputs": describe(model.graph.output)}
