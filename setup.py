"""Builds the kernel library; everything else about the package is in pyproject.toml.

``models/*.c`` become ``models/_qmatmul*.so``: a library onnxruntime loads as a
custom-operator library (and tests call through ctypes), not a Python module
(docs/models.md, "The kernel library"). For a user's install it is optional: where no C
compiler is found, or the build fails, the install still succeeds, and models are then
converted with onnxruntime's MatMulNBits instead. ``UNIUN_STRICT_BUILD=1`` (what
``bin/setup`` sets when a compiler is present, so the tests always run a fresh build) makes
every warning an error and a failed build a failed install.
"""

import os
from pathlib import Path

from setuptools import Extension, setup

STRICT = os.environ.get("UNIUN_STRICT_BUILD") == "1"
models = Path("models")

setup(ext_modules=[Extension(
    "uniun.models._qmatmul",
    sources=sorted(str(p) for p in models.glob("*.c")),
    depends=sorted(str(p) for p in models.glob("*.h")),
    libraries=["m"],
    optional=not STRICT,
    extra_compile_args=["-O3", "-std=gnu11", "-fvisibility=hidden", "-Wall", "-Wextra",
                        *(["-Werror"] if STRICT else [])])])
