"""Requantize a GGUF with llama.cpp's own quantizer (``llama_model_quantize``).

Why llama.cpp's and not ours: a benchmark of a format must run the file a user would
have, and users' K-quant and IQ files are made by llama.cpp's quantizer (its per-tensor
type mix for ``Q4_K_M``, its search for scales). Our writers produce Q4_1 and Q8_0
only (``models/convert/bench_model.py``, ``tests/models/gguf_fixtures.py``).

llama-cpp-python is a development extra, often in another interpreter than ours, so
the quantizer runs in that interpreter (``--peer-python``) as a short script that needs
only the standard library and ``llama_cpp``. ``allow_requantize`` is on: the source may
itself be quantized (a Q8_0 bench model; SmolLM2's Q4_1 file), which llama.cpp refuses
by default because requantizing loses precision. For a benchmark file that is harmless;
for a real model, start from F16 or BF16.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["PEER_FORMATS", "requantize"]

# The formats a format set holds (scripts/make_format_set.py); llama.cpp's names.
PEER_FORMATS = ("Q4_0", "Q4_1", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_NL", "IQ4_XS")

_SCRIPT = r"""
import ctypes, sys
import llama_cpp
src, dst, fmt, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + fmt, None)
if ftype is None:
    sys.exit("llama.cpp has no file type %r" % fmt)
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = ftype
params.nthread = threads
params.allow_requantize = True
code = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
sys.exit("llama_model_quantize returned %d" % code if code else 0)
"""


def requantize(src: Path, dst: Path, fmt: str, *, python: str, threads: int = 2,
               timeout_s: float = 3600.0) -> Path:
    """``src`` requantized to ``fmt`` (a llama.cpp file type name, e.g. ``Q4_K_M``) at
    ``dst``, through ``dst.partial`` so a stopped run leaves no file that looks whole.

    Raises ``RuntimeError`` with llama.cpp's own message when it fails.
    """
    fmt = fmt.upper()
    partial = dst.with_name(dst.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        proc = subprocess.run([python, "-c", _SCRIPT, str(src), str(partial), fmt,
                               str(threads)], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp's quantizer did not finish {src.name} -> {fmt} "
                           f"within {timeout_s:.0f} s") from None
    if proc.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = (proc.stderr or proc.stdout).strip()[-1500:]
        raise RuntimeError(f"llama.cpp's quantizer failed on {src.name} -> {fmt} "
                           f"(exit {proc.returncode}): {tail}")
    partial.replace(dst)
    return dst
