"""Give back the pages of a model's weight files that the loaded session no longer reads.

Why: onnxruntime memory-maps a model's external data (``model.onnx.data``) one
initializer at a time and keeps every mapping for the life of the session, also of the
weights it has already copied into its own prepacked buffers (``MatMulNBits``, the
correction ``MatMul``). The pages it read while prepacking stay mapped, so they count in
the runner's resident set: 16.5 MB for SmolLM2-135M, although nothing reads them again.
What the session does keep reading from the file is the 8-bit embedding (28 MB for
SmolLM2), a row per token; and a file the converter has just written sits in the page
cache as 2 MB folios, which a fault maps whole, so ~700 distinct tokens mapped 33 MB.

So, after load:

1. the mapped pages are dropped from this process's page tables
   (``madvise(MADV_DONTNEED)``); they stay in the page cache, so the next load of the
   model (a swap back) still reads them from memory;
2. the mappings are marked ``MADV_RANDOM`` (no readahead: a fault reads one page);
3. the file ranges of the mappings the load did not touch at all (nothing of them was
   resident: the embedding, its scales; what the graph reads lazily) are written back
   if dirty (a model converted a moment ago) and evicted from the page cache
   (``POSIX_FADV_DONTNEED``), so that an embedding row is read back as a 4 KB page and
   not mapped as part of a 2 MB folio. The same 700 tokens then mapped 4 MB, and a
   2,000-token prefill was ~2 % slower the first time its rows were read.

Only mappings without private copies are dropped (``Anonymous: 0`` in smaps): for a
private file mapping ``MADV_DONTNEED`` discards a written page, so a mapping that holds
one is left as it is. Eviction touches only pages nobody maps. Linux only; elsewhere
nothing happens.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

__all__ = ["release_mapped_pages", "file_mappings", "FileMapping"]

_MADV_RANDOM = 1
_MADV_DONTNEED = 4


@dataclass
class FileMapping:
    """One mapping of a file, as ``/proc/self/smaps`` shows it."""

    path: str
    start: int
    end: int
    offset: int  # of the mapping's first byte in the file
    rss_kb: int = 0
    anonymous_kb: int = 0  # private copies of written pages


def file_mappings(folder: Path, smaps: str = "/proc/self/smaps") -> list[FileMapping]:
    """This process's mappings of files in ``folder`` (none where smaps cannot be read)."""
    prefix = str(Path(folder).resolve()) + os.sep
    found: list[FileMapping] = []
    current: FileMapping | None = None
    try:
        with open(smaps) as f:
            for line in f:
                head, _, rest = line.partition(" ")
                if not head.endswith(":"):  # a mapping's first line: range perms ... path
                    fields = line.split(maxsplit=5)
                    current = None
                    if len(fields) == 6 and fields[5].startswith(prefix):
                        start, end = (int(x, 16) for x in fields[0].split("-"))
                        current = FileMapping(fields[5].rstrip("\n"), start, end,
                                              int(fields[2], 16))
                        found.append(current)
                elif current is not None and head == "Rss:":
                    current.rss_kb = int(rest.split()[0])
                elif current is not None and head == "Anonymous:":
                    current.anonymous_kb = int(rest.split()[0])
    except OSError:
        return []
    return found


def release_mapped_pages(folder: Path) -> int:
    """Drop this process's clean mapped pages of the files in ``folder``, and evict the
    ranges the load left untouched from the page cache (see the module doc); the bytes
    that were resident."""
    if not Path("/proc/self/smaps").exists():
        return 0
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    released = 0
    untouched: dict[str, list[FileMapping]] = {}
    for m in file_mappings(folder):
        if m.anonymous_kb:
            continue
        if m.rss_kb == 0:
            untouched.setdefault(m.path, []).append(m)
        for advice in (_MADV_DONTNEED, _MADV_RANDOM):
            if libc.madvise(m.start, m.end - m.start, advice) != 0:
                logger.debug("madvise({:#x}, {}, {}) failed: errno {}", m.start,
                             m.end - m.start, advice, ctypes.get_errno())
                break
        else:
            released += m.rss_kb * 1024
    for name, mappings in untouched.items():
        _evict(name, [(m.offset, m.end - m.start) for m in mappings])
    return released


def _evict(name: str, ranges: list[tuple[int, int]]) -> None:
    """Write back and drop ``ranges`` (offset, length) of file ``name`` from the page cache."""
    try:
        fd = os.open(name, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fdatasync(fd)  # dirty pages are not evicted; a just-converted model has them
        for offset, length in ranges:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    except OSError as err:
        logger.debug("evicting {} failed: {}", name, err)
    finally:
        os.close(fd)
