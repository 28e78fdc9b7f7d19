"""The runner process's own memory: how big it is, and the glibc calls that keep it small.

Why a module: the decoder's load (:mod:`uniun.models.decoder_model`) and the page
release after it (:mod:`uniun.models.mapped_pages`) both talk to glibc; one handle,
loaded once, and a no-op where there is no glibc.
"""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache

__all__ = ["libc", "rss_bytes", "tune_malloc", "trim_heap", "MMAP_THRESHOLD"]


@lru_cache(maxsize=1)
def libc() -> ctypes.CDLL | None:
    """glibc (``errno`` kept for ``ctypes.get_errno``), or None where it is not there."""
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


def rss_bytes() -> int:
    """This process's resident set size now (Linux ``/proc``; 0 where unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
MMAP_THRESHOLD = 1 << 20


def tune_malloc() -> None:
    """Serve allocations of 1 MB and more from their own mappings, always (glibc only).

    Why: glibc raises its mmap threshold each time such a block is freed, up to 32 MB,
    and then serves the next KV buffer (11.8 MB for SmolLM2) or prefill activation from
    the heap, which keeps it resident after it is freed. A fixed threshold returns every
    freed buffer to the system and leaves never-written KV positions untouched.
    """
    c = libc()
    if c is not None and hasattr(c, "mallopt"):
        c.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def trim_heap() -> None:
    """Give the heap's free pages back to the system (glibc ``malloc_trim``; elsewhere a no-op).

    Why: parsing ``tokenizer.json`` and building the session leave ~20-30 MB of freed
    heap that glibc keeps mapped; the runner's RSS is what a phone would kill it for.
    """
    c = libc()
    if c is not None and hasattr(c, "malloc_trim"):
        c.malloc_trim(0)
