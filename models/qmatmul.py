"""The kernel library: where it is, whether it runs here, and how a session gets it.

``models/*.c`` are built by ``bin/setup`` (``pip install -e .``) into
``models/_qmatmul*.so``: an onnxruntime custom-operator library (the ``uniun`` domain:
``QMatMul``, 4- and 8-bit blocks as the GGUF file has them with activations in 8 bits, and
the ggml-arithmetic operators; docs/models.md, "The kernel library"). It is optional for a
user's install: without a C compiler the install succeeds without it, and the converter
then writes ``MatMulNBits`` graphs.

The converter uses it when :func:`fast` (the library is there and this CPU has its
AVX-512 VNNI or AVX2 level; elsewhere the portable kernels would be slower than
``MatMulNBits``), and a session that loads a graph with its operators registers the
library (:func:`register`). Tests and benchmarks call the kernel directly through
:func:`matmul`, and run every instruction-set level this CPU has (:func:`paths`) by
forcing one (:func:`forced_path`).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger

from uniun.models.onnx_ops import op_types

__all__ = ["DATA_FILE", "DOMAIN", "FORMATS", "GGML_OPS", "OP_TYPE", "KernelMissing", "fast",
           "forced_path", "ggml_fast", "library", "matmul", "path_name", "paths", "prepare",
           "register"]

OP_TYPE = "QMatMul"
DOMAIN = "uniun"
DATA_FILE = "model.qblocks.data"  # a converted model's QMatMul blocks (read in place)
# Codes (4 or 8 bits) minus a zero point, times a scale, plus an offset (qmatmul.h): the
# fp16 formats are GGUF's Q4_0, Q4_1, Q8_0 (and Q5_0 as 8-bit codes); the "f" formats hold
# float32 scales and offsets, for what fp16 cannot (K-quants, Q5_1); "q8_0h" is Q6_K's
# shape, a float32 scale per 16.
FORMATS = {"q4_0": 0, "q4_1": 1, "q8_0": 2, "q4_0f": 3, "q4_1f": 4, "q8_0f": 5, "q8_1f": 6,
           "q8_0h": 7}
# The instruction-set levels (isa.h), in order: each kernel runs its best variant at or
# below the level in force.
PATHS = {"scalar": 0, "avx2": 1, "avx512": 2}
GGML_OPS = {"GgmlRmsNorm", "GgmlRope", "GgmlSwiGlu", "GgmlAttention"}  # models/ggml_ort.c


class KernelMissing(RuntimeError):
    """A graph needs the QMatMul library and this installation was built without it."""


@cache
def library() -> Path | None:
    """The built library next to this module, or None (not built)."""
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"_qmatmul{suffix}"
        if candidate.is_file():
            return candidate
    return None


@cache
def _lib() -> ctypes.CDLL | None:
    path = library()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
        lib.uniun_isa_force  # noqa: B018 - a build older than this module lacks it
    except (OSError, AttributeError):
        return None  # not loadable, or stale: KernelMissing then says to run bin/setup
    p = ctypes.c_void_p
    lib.uniun_qmatmul.argtypes = [ctypes.c_int, ctypes.c_int, p, ctypes.c_int, ctypes.c_int, p,
                                  ctypes.c_int, p, p, ctypes.c_int]
    lib.uniun_qmatmul.restype = ctypes.c_int
    for name in ("uniun_isa_best", "uniun_isa_level"):
        getattr(lib, name).restype = ctypes.c_int
    for name in ("uniun_isa_supports", "uniun_isa_force"):
        getattr(lib, name).argtypes = [ctypes.c_int]
        getattr(lib, name).restype = ctypes.c_int
    lib.uniun_qmatmul_block_bytes.argtypes = [ctypes.c_int]
    lib.uniun_qmatmul_block_bytes.restype = ctypes.c_size_t
    return lib


def path_name() -> str | None:
    """The best level this CPU has (``avx512``, ``avx2`` or ``scalar``), None without the
    library. What the converter decides by; a forced level does not change it."""
    lib = _lib()
    if lib is None:
        return None
    best = lib.uniun_isa_best()
    return next(name for name, code in PATHS.items() if code == best)


def paths() -> list[str]:
    """Every level this CPU can run (tests force each in turn and compare them all)."""
    lib = _lib()
    return [] if lib is None else [n for n, c in PATHS.items() if lib.uniun_isa_supports(c)]


@contextmanager
def forced_path(name: str) -> Iterator[None]:
    """Run every kernel call of this process at level ``name`` (``scalar``, ``avx2``,
    ``avx512``) inside the block, sessions already loaded included; the level before is
    back afterwards. ``UNIUN_ISA=<name>`` does the same for a whole process."""
    lib = _lib()
    if lib is None:
        raise KernelMissing("the kernel library is not built (run bin/setup)")
    if lib.uniun_isa_force(PATHS[name]) != 0:
        raise ValueError(f"this CPU has no {name} level (it has {', '.join(paths())})")
    try:
        yield
    finally:
        lib.uniun_isa_force(-1)


def fast() -> bool:
    """Whether converting to QMatMul pays here: the library loads and this CPU has a vector
    level. Both the AVX-512 VNNI and the AVX2 kernels decode faster than ``MatMulNBits``
    (MLAS's AVX-512 kernels included); the portable one is several times slower."""
    return path_name() in ("avx512", "avx2")


def ggml_fast() -> bool:
    """Whether llama.cpp's arithmetic (``models/convert/ggml_decoder.py``) runs fast here:
    QMatMul's ggml order has AVX-512 VNNI and AVX2 kernels, and the ggml operators need
    AVX2, FMA and F16C. The graph is the same at both levels: its operators pick, when
    they run, the order of llama.cpp built for the level in force, so a model converted
    on one machine gives llama.cpp's logits on the other too."""
    lib = _lib()
    return (lib is not None and path_name() in ("avx512", "avx2")
            and bool(lib.uniun_ggml_supported()))


def register(options: Any) -> None:
    """Add the library's ``uniun`` operators to onnxruntime ``SessionOptions``."""
    path = library()
    if path is None or _lib() is None:
        raise KernelMissing(
            "this model was converted for the QMatMul kernel (models/qmatmul*.c), and "
            "this installation has no build of it: run bin/setup with a C compiler installed "
            "(gcc), or convert the model again here (it then uses MatMulNBits)")
    options.register_custom_ops_library(str(path))


def prepare(options: Any, model_file: Path) -> set[str]:
    """Register the library on ``options`` if ``model_file``'s graph uses the op; the
    graph's operator types (read without importing onnx: ``models/onnx_ops.py``)."""
    ops = op_types(model_file)
    if OP_TYPE in ops or GGML_OPS & ops:
        register(options)
        if not fast():
            logger.warning("{} was converted for QMatMul's vector paths (AVX-512 VNNI, "
                           "AVX2), which this CPU lacks: it runs on the portable C path, "
                           "slower than MatMulNBits; convert it again here (models pull "
                           "--force, or models import)", model_file.parent.name)
    return ops


def matmul(data: np.ndarray, fmt: str, n: int, k: int, x: np.ndarray,
           residual: np.ndarray | None = None, *, path: str | None = None,
           ggml: bool = False) -> np.ndarray:
    """``x @ W.T (+ residual)`` for packed ``data`` (one thread; ``path`` None: the level in
    force; ``ggml``: llama.cpp's summation order, formats q4_1 and q8_0)."""
    lib = _lib()
    if lib is None:
        raise KernelMissing("the QMatMul library is not built (run bin/setup)")
    x = np.ascontiguousarray(x, np.float32).reshape(-1, k)
    m = x.shape[0]
    y = np.empty((m, n), np.float32)
    r = None if residual is None else np.ascontiguousarray(residual, np.float32).reshape(m, n)
    data = np.ascontiguousarray(data, np.uint8)
    want = -(-n // 16) * (k // 32) * lib.uniun_qmatmul_block_bytes(FORMATS[fmt])
    if data.size != want:
        raise ValueError(f"QMatMul: {data.size} bytes of {fmt} weights, [{n}, {k}] needs {want}")
    code = -1 if path is None else PATHS[path]
    rc = lib.uniun_qmatmul(FORMATS[fmt], code, data.ctypes.data, n, k, x.ctypes.data, m,
                           None if r is None else r.ctypes.data, y.ctypes.data, int(ggml))
    if rc != 0:
        raise ValueError(f"QMatMul refused: format {fmt}, n {n}, k {k}, path {path}, "
                         f"ggml {ggml}")
    return y
