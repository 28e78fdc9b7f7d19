"""Give back the mapped pages the loaded session no longer reads: of a model's weight
files, and of shared-library code (:func:`release_code_pages`).

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from uniun.models.process_memory import libc

__all__ = ["release_mapped_pages", "release_code_pages", "file_mappings", "code_mappings",
           "FileMapping"]

_MADV_RANDOM = 1
_MADV_WILLNEED = 3
_MADV_DONTNEED = 4
_code_evicted = False  # see release_code_pages


@dataclass
class FileMapping:
    """One mapping of a file, as ``/proc/self/smaps`` shows it."""

    path: str
    start: int
    end: int
    offset: int  # of the mapping's first byte in the file
    perms: str = ""
    rss_kb: int = 0
    anonymous_kb: int = 0  # private copies of written pages


def _mappings(accept: Callable[[str, str], bool],
              smaps: str = "/proc/self/smaps") -> list[FileMapping]:
    """This process's file mappings for which ``accept(perms, path)`` holds (none where
    smaps cannot be read)."""
    found: list[FileMapping] = []
    current: FileMapping | None = None
    try:
        with open(smaps) as f:
            for line in f:
                head, _, rest = line.partition(" ")
                if not head.endswith(":"):  # a mapping's first line: range perms ... path
                    fields = line.split(maxsplit=5)
                    current = None
                    path = fields[5].rstrip("\n") if len(fields) == 6 else ""
                    if path and accept(fields[1], path):
                        start, end = (int(x, 16) for x in fields[0].split("-"))
                        current = FileMapping(path, start, end, int(fields[2], 16), fields[1])
                        found.append(current)
                elif current is not None and head == "Rss:":
                    current.rss_kb = int(rest.split()[0])
                elif current is not None and head == "Anonymous:":
                    current.anonymous_kb = int(rest.split()[0])
    except OSError:
        return []
    return found


def file_mappings(folder: Path, smaps: str = "/proc/self/smaps") -> list[FileMapping]:
    """This process's mappings of files in ``folder``."""
    prefix = str(Path(folder).resolve()) + os.sep
    return _mappings(lambda _perms, path: path.startswith(prefix), smaps)


def code_mappings(smaps: str = "/proc/self/smaps") -> list[FileMapping]:
    """This process's executable mappings of shared libraries (``r-xp``, ``*.so*``)."""
    return _mappings(lambda perms, path: perms == "r-xp" and ".so" in Path(path).name, smaps)


def release_mapped_pages(folder: Path, *, read_in_place: tuple[str, ...] = ()) -> int:
    """Drop this process's clean mapped pages of the files in ``folder``, and evict the
    ranges the load left untouched from the page cache (see the module doc); the bytes
    that were resident.

    Files named in ``read_in_place`` are what a kernel reads straight from the mapping on
    every pass (``uniun.QMatMul``'s blocks, ``model.qblocks.data``): their mappings keep
    their pages and their readahead, and are asked in (``MADV_WILLNEED``) so the first
    pass does not wait for the disk.
    """
    mappings = file_mappings(folder)
    kept = [m for m in mappings if Path(m.path).name in read_in_place]
    _will_need(kept)
    return _release([m for m in mappings if m not in kept], evict_touched=False)


def _will_need(mappings: list[FileMapping]) -> None:
    c = libc()
    if c is None:
        return
    c.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for m in mappings:
        c.madvise(m.start, m.end - m.start, _MADV_WILLNEED)


def release_code_pages() -> int:
    """Drop this process's mapped pages of shared-library code, and evict them from the
    page cache where nobody else maps them; the bytes that were resident.

    Why: importing onnxruntime and building a session run a great deal of code once
    (kernel registration, graph optimizers), and a library pip has just written sits in
    the page cache as large folios, each mapped whole by one fault: most of onnxruntime's
    library stays resident. Code is never written, so dropping it loses nothing; what a
    forward pass runs comes back a 4 KB page per fault (no readahead, ``MADV_RANDOM``),
    read from disk once: a lower peak RSS for the runner, for a first pass that is slower
    once (docs/models.md "Memory"). Evicted the first time only:
    after that the code is cached as small pages, and a later load (a model swap) gets
    its pages back from memory, not from disk.
    """
    global _code_evicted
    released = _release(code_mappings(), evict_touched=not _code_evicted)
    _code_evicted = True
    return released


def _release(mappings: list[FileMapping], *, evict_touched: bool) -> int:
    """MADV_DONTNEED + MADV_RANDOM on each mapping without private copies; then evict
    from the page cache the ranges of those left untouched (or, ``evict_touched``, of all
    those dropped)."""
    c = libc()
    if not mappings or c is None:  # no mappings also where there is no /proc (not Linux)
        return 0
    c.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    released = 0
    to_evict: dict[str, list[FileMapping]] = {}
    for m in mappings:
        if m.anonymous_kb:
            continue
        for advice in (_MADV_DONTNEED, _MADV_RANDOM):
            if c.madvise(m.start, m.end - m.start, advice) != 0:
                logger.debug("madvise({:#x}, {}, {}) failed: errno {}", m.start,
                             m.end - m.start, advice, ctypes.get_errno())
                break
        else:
            released += m.rss_kb * 1024
            if evict_touched or m.rss_kb == 0:
                to_evict.setdefault(m.path, []).append(m)
    for name, evicted in to_evict.items():
        _evict(name, [(m.offset, m.end - m.start) for m in evicted])
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
