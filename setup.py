"""Builds the QMatMul kernel library; everything else about the package is in pyproject.toml.

``models/qmatmul.c`` becomes ``models/_qmatmul*.so``: a library onnxruntime loads as a
custom-operator library (and tests call through ctypes), not a Python module. It is
optional: where no C compiler is found the install still succeeds, and models are then
converted with onnxruntime's MatMulNBits instead (docs/models.md, "The QMatMul kernel").
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "uniun.models._qmatmul", sources=["models/qmatmul.c", "models/ggml_ops.c", "models/ggml_ort.c"], libraries=["m"], optional=True,
    extra_compile_args=["-O3", "-std=gnu11", "-fvisibility=hidden"])])
