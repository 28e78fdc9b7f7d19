"""The sampler's per-token helpers in C (``models/sampling_ops.c``), with numpy fallbacks.

Both give the same numbers, bit for bit (tests/models/test_penalties.py compares them):
the C is only faster where it matters, right after a forward pass (the C file says why).
The library is the kernel library ``bin/setup`` builds (``models/_qmatmul*.so``); where it
is missing or older than this module, the numpy code runs.
"""

from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

__all__ = ["available", "penalize", "top_k"]

MAX_K = 64  # the C search's short list


@cache
def _lib() -> ctypes.CDLL | None:
    from uniun.models.qmatmul import library

    path = library()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
        penalize_fn, top_k_fn = lib.uniun_penalize, lib.uniun_top_k
    except (OSError, AttributeError):  # not loadable, or a build older than this module
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    penalize_fn.argtypes = [p, i64, p, i64, ctypes.c_float, p, p, i64, ctypes.c_float,
                            ctypes.c_float]
    penalize_fn.restype = None
    top_k_fn.argtypes = [p, i64, ctypes.c_int, p, p]
    top_k_fn.restype = ctypes.c_int
    return lib


def available() -> bool:
    return _lib() is not None


def penalize(x: np.ndarray, window: np.ndarray, rp: float, generated: np.ndarray,
             counts: np.ndarray, freq: float, pres: float, *, use_c: bool = True) -> None:
    """In place on float32 ``x``: the repetition penalty on ``window`` ids, then minus
    ``counts * freq + pres`` on ``generated`` ids (each list's ids distinct; ids outside
    ``x`` are skipped)."""
    lib = _lib() if use_c else None
    if lib is not None and x.flags.c_contiguous:
        # No conversion when the arrays are already what C reads (the penalties' are):
        # each numpy call costs in the step, right after a forward pass.
        if not (window.dtype == np.int64 and window.flags.c_contiguous):
            window = np.ascontiguousarray(window, np.int64)
        if not (generated.dtype == np.int64 and generated.flags.c_contiguous):
            generated = np.ascontiguousarray(generated, np.int64)
        if not (counts.dtype == np.float32 and counts.flags.c_contiguous):
            counts = np.ascontiguousarray(counts, np.float32)
        lib.uniun_penalize(x.ctypes.data, x.shape[0], window.ctypes.data, window.shape[0],
                           rp, generated.ctypes.data, counts.ctypes.data, generated.shape[0],
                           freq, pres)
        return
    n = x.shape[0]
    if window.shape[0]:
        ids = window[(window >= 0) & (window < n)]
        values = x[ids]
        x[ids] = np.where(values <= 0, values * np.float32(rp), values / np.float32(rp))
    if generated.shape[0]:
        keep = (generated >= 0) & (generated < n)
        ids, c = generated[keep], counts[keep].astype(np.float32)
        x[ids] -= c * np.float32(freq) + np.float32(1.0) * np.float32(pres)


_VALS = np.empty(MAX_K, np.float32)  # the C search's values: written, never read


def top_k(x: np.ndarray, k: int, *, use_c: bool = True) -> np.ndarray:
    """The ids of the ``k`` largest values of float32 ``x``, largest first, equal values
    by lowest id (a new array)."""
    k = min(int(k), x.shape[0])
    lib = _lib() if use_c else None
    if lib is not None and 1 <= k <= MAX_K and x.flags.c_contiguous and x.dtype == np.float32:
        ids = np.empty(k, np.int64)
        found = lib.uniun_top_k(x.ctypes.data, x.shape[0], k, ids.ctypes.data,
                                _VALS.ctypes.data)
        return ids[:found]
    n = x.shape[0]
    part = np.argpartition(x, n - k)[n - k:] if k < n else np.arange(n)
    least = x[part].min()
    if np.count_nonzero(x == least) > np.count_nonzero(x[part] == least):
        # a tie straddles the cut: argpartition kept any of the tied; the lowest win
        above = np.flatnonzero(x > least)
        part = np.concatenate([above, np.flatnonzero(x == least)[: k - above.shape[0]]])
    return part[np.lexsort((part, -x[part]))]
