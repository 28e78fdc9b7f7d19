"""The QMatMul kernel (models/qmatmul*.c) against an independent numpy reference.

The reference does llama.cpp's arithmetic in float64 from the unpacked blocks: the
activations quantised to 8 bits per 32 (scale amax / 127 rounded to fp16, codes rounded
to nearest even, Q8_1's fp16 ``d * sum``), integer dot products per block, then
``d_w * d_x * isum (+ m_w * s_x)``. The kernel must agree to float32 rounding, on every path
this CPU has, for every format, with rows that do not fill a group of 16, several
activation rows, and a residual; and every path must give the portable one's bits. Paths
are models/isa.h's levels: the tests run each one this CPU has, called directly or
forced on a session (``qmatmul.forced_path``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from uniun.models import qmatmul
from uniun.models.convert.decoder_spec import BlockQuantized
from uniun.models.convert.qmatmul_pack import pack

FORMATS = ("q4_0", "q4_1", "q8_0", "q4_0f", "q4_1f", "q8_0f", "q8_1f", "q8_0h")
SHAPES = [(40, 64, 1), (37, 96, 5), (576, 576, 3), (16, 32, 9)]  # n, k, activation rows


def _paths() -> list[str]:
    return qmatmul.paths() or ["scalar"]  # (no library: the tests below say so)


def random_blocks(fmt: str, n: int, k: int, seed: int = 0) -> BlockQuantized:
    """A weight as the GGUF importer hands it over: fp16 scales for GGUF's own formats,
    float32 ones (a K-quant's ``d * sc``) for the "f" formats, a scale per 16 for Q6_K's
    "q8_0h"."""
    rng = np.random.default_rng(seed)
    block = 16 if fmt == "q8_0h" else 32
    blocks = k // block
    d = rng.random((n, blocks), np.float32) * np.float32(0.02) + np.float32(1e-3)
    if fmt in ("q4_0", "q4_1", "q8_0"):
        d = d.astype(np.float16).astype(np.float32)
    offsets = None
    if fmt in ("q4_1", "q4_1f", "q8_1f"):
        m = -rng.random((n, blocks), np.float32) * np.float32(0.1)
        if fmt == "q4_1":
            m = m.astype(np.float16).astype(np.float32)
        offsets = (m + np.float32(8) * d).astype(np.float32) if fmt == "q4_1" else m
    if fmt.startswith("q8"):
        codes = rng.integers(1, 256, (n, k)).astype(np.uint8)
        return BlockQuantized(codes.reshape(n, blocks, block), d, offsets, 8, block, (n, k))
    q = rng.integers(0, 16, (n, k)).astype(np.uint8)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(n, blocks, 16)
    return BlockQuantized(packed, d, offsets, 4, 32, (n, k))


def reference(w: BlockQuantized, fmt: str, x: np.ndarray,
              residual: np.ndarray | None) -> np.ndarray:
    """llama.cpp's dot products of these blocks with Q8 activations, in float64.

    Activations: 8 bits per 32, scale amax / 127 kept in fp16, codes rounded to nearest
    even. Q4_1 is llama.cpp's ``d * isum * d_x + m * s_x``, with ``s_x = d_x * sum x_q`` in
    float (llama.cpp rounds it to fp16: see qmatmul.h); every other format is
    ``(code - zero point) . x_q * scale * d_x (+ offset * d_x * sum x_q)``.
    """
    n, k = w.shape
    blocks, per32 = k // w.block_size, 32 // w.block_size  # weight blocks, and per 32
    xb = x.reshape(-1, k // 32, 32)
    amax = np.abs(xb).max(-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    xq = np.rint(xb * inv[..., None]).astype(np.int64)  # ties to even, as cvtps2dq
    d_x = (amax / np.float32(127)).astype(np.float16).astype(np.float64)
    xq = xq.reshape(-1, blocks, w.block_size)  # along the weight's blocks
    d_x = np.repeat(d_x, per32, axis=-1)
    if w.bits == 8:
        codes = w.packed.reshape(n, blocks, w.block_size).astype(np.int64)
    else:
        codes = np.stack([w.packed & 15, w.packed >> 4], -1).reshape(n, blocks, 32)
        codes = codes.astype(np.int64)
    scales = w.scales.astype(np.float64)
    offsets = w.offsets
    if fmt == "q4_1":  # d * q + m, m = offset - 8 d
        offsets = w.offsets - np.float32(8) * w.scales
    else:
        codes = codes - 2 ** (w.bits - 1)
    x_offset = d_x * xq.sum(-1)
    isum = np.einsum("nbi,mbi->mnb", codes, xq).astype(np.float64)
    y = (isum * scales[None] * d_x[:, None, :]).sum(-1)
    if offsets is not None:
        y += (offsets.astype(np.float64)[None] * x_offset[:, None, :]).sum(-1)
    return y if residual is None else y + residual


def test_the_kernel_library_is_built_and_names_its_path() -> None:
    assert qmatmul.library() is not None, "bin/setup did not build models/*.c"
    assert qmatmul.path_name() in ("avx512", "avx2", "scalar")
    assert "scalar" in qmatmul.paths() and qmatmul.path_name() in qmatmul.paths()


def test_a_level_is_forced_for_a_block_or_a_process_and_a_missing_one_refused() -> None:
    lib = qmatmul._lib()
    assert lib is not None
    # The process's level: UNIUN_ISA where this CPU has it, else the best it has.
    wanted = os.environ.get("UNIUN_ISA", "")
    best = qmatmul.PATHS[wanted if wanted in qmatmul.paths() else qmatmul.path_name() or "scalar"]
    assert lib.uniun_isa_level() == best
    with qmatmul.forced_path("scalar"):
        assert lib.uniun_isa_level() == 0
    assert lib.uniun_isa_level() == best
    assert lib.uniun_isa_force(3) == -1 and lib.uniun_isa_level() == best
    with pytest.raises(KeyError), qmatmul.forced_path("avx1024"):
        pass
    # a whole process, from its environment; a level the CPU lacks leaves the best
    probe = ("from uniun.models import qmatmul; import sys; "
             "sys.stdout.write(str(qmatmul._lib().uniun_isa_level()))")
    for name in ("scalar", "no-such-level"):
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             check=True, env={**os.environ, "UNIUN_ISA": name}).stdout
        assert out == str(0 if name == "scalar" else qmatmul.PATHS[qmatmul.path_name() or "scalar"])


@pytest.mark.parametrize("path", _paths())
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_and_path_matches_llama_cpps_arithmetic(fmt: str, path: str) -> None:
    rng = np.random.default_rng(1)
    for n, k, m in SHAPES:
        w = random_blocks(fmt, n, k, seed=n)
        packed = pack(w)
        assert packed is not None and packed.format == fmt
        x = rng.standard_normal((m, k)).astype(np.float32)
        r = rng.standard_normal((m, n)).astype(np.float32)
        for residual in (None, r):
            got = qmatmul.matmul(packed.data, fmt, n, k, x, residual, path=path)
            want = reference(w, fmt, x, residual)
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * np.abs(want).max())
            # and the portable kernel's bits: the same fused steps in the same order
            portable = qmatmul.matmul(packed.data, fmt, n, k, x, residual, path="scalar")
            assert np.array_equal(got, portable)


@pytest.mark.parametrize("path", _paths())
@pytest.mark.parametrize("fmt,ggml", [("q4_1", False), ("q8_0", False), ("q4_1", True),
                                      ("q8_0", True)])
def test_a_row_does_not_depend_on_the_rows_beside_it(path: str, fmt: str, ggml: bool) -> None:
    """A position's logits are the same in a one-token and a many-token pass (batched
    resume replays rely on it: models/decoder_model.py, exact_replay), and a conversation's
    the same whichever others share a batch: the vector kernels take up to four activation
    rows per pass over a block's weights, and a row's sums must not notice."""
    w = random_blocks(fmt, 100, 192)
    packed = pack(w)
    assert packed is not None
    x = np.random.default_rng(2).standard_normal((9, 192)).astype(np.float32)
    together = qmatmul.matmul(packed.data, fmt, 100, 192, x, path=path, ggml=ggml)
    for i in range(9):
        alone = qmatmul.matmul(packed.data, fmt, 100, 192, x[i:i + 1], path=path, ggml=ggml)
        assert np.array_equal(alone[0], together[i]), f"row {i} alone differs"
    for m in range(2, 9):  # every pass size and tail: 2, 3, 4, 4 + 1, ...
        first = qmatmul.matmul(packed.data, fmt, 100, 192, x[:m], path=path, ggml=ggml)
        assert np.array_equal(first, together[:m]), f"{m} rows differ"


def test_blocks_fp16_cannot_hold_keep_float32_scales_and_others_are_refused() -> None:
    w = random_blocks("q4_1", 32, 64)
    kquant = BlockQuantized(w.packed, w.scales * np.float32(1.0001), w.offsets, 4, 32, w.shape)
    packed = pack(kquant)  # a scale fp16 cannot hold (a K-quant's d * sc): float32 scales
    assert packed is not None and packed.format == "q4_1f"
    x = np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_allclose(qmatmul.matmul(packed.data, "q4_1f", 32, 64, x),
                               reference(kquant, "q4_1f", x, None), rtol=2e-6, atol=1e-5)
    assert pack(BlockQuantized(w.packed, w.scales, w.offsets, 4, 64, (32, 64))) is None
    with pytest.raises(ValueError, match="needs"):
        qmatmul.matmul(np.zeros(10, np.uint8), "q4_1", 32, 64, np.zeros((1, 64), np.float32))


def _graph(packed_data: np.ndarray, n: int, k: int, fmt: str) -> bytes:
    node = helper.make_node("QMatMul", ["x", "w", "r"], ["y"], domain="uniun", K=k, N=n,
                            format=fmt)
    graph = helper.make_graph(
        [node], "qmatmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", k]),
                            helper.make_tensor_value_info("r", TensorProto.FLOAT, ["b", "s", n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(packed_data, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("uniun", 1)])
    return model.SerializeToString()


@pytest.mark.parametrize("path", _paths())
def test_onnxruntime_runs_the_op_on_its_threads_as_the_kernel_does(tmp_path: Path,
                                                                  path: str) -> None:
    """The operator runs the level in force, cut across onnxruntime's threads, and gives
    what the one-thread call on that path gives."""
    with qmatmul.forced_path(path):
        _check_op(tmp_path, path)


def _check_op(tmp_path: Path, path_name: str) -> None:
    w = random_blocks("q4_1", 300, 576)
    packed = pack(w)
    assert packed is not None
    path = tmp_path / "model.onnx"
    path.write_bytes(_graph(packed.data, 300, 576, "q4_1"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    assert qmatmul.OP_TYPE in qmatmul.prepare(options, path)
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 576)).astype(np.float32)
    r = rng.standard_normal((2, 5, 300)).astype(np.float32)
    [y] = session.run(None, {"x": x, "r": r})
    assert y.shape == (2, 5, 300)
    assert np.array_equal(y.reshape(10, 300),
                          qmatmul.matmul(packed.data, "q4_1", 300, 576, x, r, path=path_name))

    wrong = tmp_path / "wrong.onnx"  # blocks of another N: refused with a reason, no crash
    wrong.write_bytes(_graph(packed.data, 320, 576, "q4_1"))
    bad = ort.InferenceSession(str(wrong), options, providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="W's size does not match"):
        bad.run(None, {"x": x, "r": np.zeros((2, 5, 320), np.float32)})


def test_a_graph_that_needs_the_library_says_how_to_get_it(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    w = pack(random_blocks("q8_0", 16, 32))
    assert w is not None
    path = tmp_path / "model.onnx"
    path.write_bytes(_graph(w.data, 16, 32, "q8_0"))
    monkeypatch.setattr(qmatmul, "library", lambda: None)
    with pytest.raises(qmatmul.KernelMissing, match="bin/setup"):
        qmatmul.prepare(ort.SessionOptions(), path)


# -- llama.cpp's summation order (ggml=1: models/convert/ggml_decoder.py) ------------------

def _fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fused multiply-add: the float64 product of two float32 values is exact, so
    one rounding of product + addend to float64 and one to float32 (a double rounding
    only at exact float32 ties of the float64 result: absent from these data)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def ggml_order(w: BlockQuantized, fmt: str, x: np.ndarray,
               residual: np.ndarray | None) -> np.ndarray:
    """ggml's ``vec_dot_q4_1_q8_1`` / ``vec_dot_q8_0_q8_0`` as its x86 build runs them, in
    float32: per block, 8 integer lanes of 4 products each; per lane a fused multiply-add
    of ``d_w * d_x`` times the lane; the lanes added as ``hsum_float_8`` does; Q4_1's
    ``m * s`` (s = fp16(d * sum), unrounded d) accumulated apart and added last."""
    n, k = w.shape
    blocks = k // 32
    xb = x.reshape(-1, blocks, 32).astype(np.float32)
    amax = np.abs(xb).max(-1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    xq = np.rint(xb * inv[..., None]).astype(np.int64)
    d_x = d.astype(np.float16).astype(np.float32)
    s_x = (d * xq.sum(-1).astype(np.float32)).astype(np.float16).astype(np.float32)
    if w.bits == 8:
        codes = w.packed.reshape(n, blocks, 32).astype(np.int64) - 128
    else:
        codes = np.stack([w.packed & 15, w.packed >> 4], -1).reshape(n, blocks, 32)
        codes = codes.astype(np.int64)
    lanes = np.einsum("nbcj,mbcj->mnbc", codes.reshape(n, blocks, 8, 4),
                      xq.reshape(-1, blocks, 8, 4)).astype(np.float32)
    scale = (w.scales[None] * d_x[:, None, :]).astype(np.float32)  # [m, n, blocks]
    acc = np.zeros((*lanes.shape[:2], 8), np.float32)
    summs = np.zeros(lanes.shape[:2], np.float32)
    mins = None if fmt != "q4_1" else (w.offsets - np.float32(8) * w.scales).astype(np.float32)
    for b in range(blocks):
        acc = _fma32(scale[..., b, None], lanes[:, :, b], acc)
        if mins is not None:
            summs = _fma32(mins[None, :, b], s_x[:, None, b], summs)
    a = [acc[..., c] for c in range(8)]
    y = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
    y = y + summs
    return y if residual is None else y + residual


@pytest.mark.parametrize("path", _paths())
@pytest.mark.parametrize("fmt", ("q4_1", "q8_0"))
def test_the_ggml_order_is_llama_cpps_bit_for_bit(fmt: str, path: str) -> None:
    """Not close: equal. A Q8 activation code that flips on a last-bit difference is what
    makes greedy text part from llama.cpp's (docs/models.md)."""
    rng = np.random.default_rng(5)
    for n, k, m in SHAPES:
        w = random_blocks(fmt, n, k, seed=n + 1)
        packed = pack(w)
        assert packed is not None and packed.format == fmt
        x = rng.standard_normal((m, k)).astype(np.float32)
        r = rng.standard_normal((m, n)).astype(np.float32)
        for residual in (None, r):
            got = qmatmul.matmul(packed.data, fmt, n, k, x, residual, path=path, ggml=True)
            want = ggml_order(w, fmt, x, residual)
            assert np.array_equal(got, want), (
                f"{np.count_nonzero(got != want)} of {got.size} differ, "
                f"largest by {np.abs(got - want).max():.3g}")


def test_the_ggml_order_takes_only_the_formats_ggml_does_not_repack() -> None:
    packed = pack(random_blocks("q4_0", 16, 64))
    assert packed is not None
    with pytest.raises(ValueError, match="ggml True"):
        qmatmul.matmul(packed.data, "q4_0", 16, 64, np.ones((1, 64), np.float32), ggml=True)
