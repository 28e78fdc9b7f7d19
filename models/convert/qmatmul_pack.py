"""Weights in the ``uniun.QMatMul`` layout: GGUF's blocks, regrouped for the kernel.

Why apart from the graph builder: this is the one place that knows the byte layout the
C kernel reads (``models/qmatmul.h`` documents it: rows in groups of 16; per group and
32-wide block, the codes of the 16 rows interleaved four elements at a time, then their
scales and, where the format has one, their offsets). Everything here is numpy and runs
once, at conversion.

Every block is kept exactly. A weight arrives as a :class:`BlockQuantized`, value =
``(code - 2 ** (bits - 1)) * scale + offset``:

- fp16 holds the scales (and Q4_1's ``m = offset - 8 * scale``): GGUF's own Q4_0, Q4_1,
  Q8_0 (and Q5_0, whose codes arrive as 8-bit ``q + 112``): ``q4_0``, ``q4_1``, ``q8_0``,
  read as llama.cpp reads them;
- otherwise (a K-quant sub-block's ``d * sc`` and ``dmin * m``, Q5_1's ``m + 16 d``):
  ``q4_0f``, ``q4_1f``, ``q8_0f``, ``q8_1f``, with float32 scales and offsets, the
  importer's values as they are;
- Q6_K's 16-wide sub-blocks (8-bit codes ``q + 96``, no offset): ``q8_0h``, two float32
  scales per 32-wide block.

:func:`pack` returns None only for what the kernel does not take (:func:`packable`: other
block widths or bit widths); the builder keeps ``MatMulNBits`` for those.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from uniun.models.convert.decoder_spec import BlockQuantized

__all__ = ["PackedWeight", "format_of", "pack", "packable", "GROUP", "BLOCK"]

GROUP = 16  # rows per group
BLOCK = 32  # elements per block along K


@dataclass(frozen=True)
class PackedWeight:
    """A weight [n, k] in the kernel's layout: uint8 [ceil(n / 16), k / 32, block bytes]."""

    data: np.ndarray
    format: str
    n: int
    k: int


def _fp16_exact(values: np.ndarray) -> np.ndarray | None:
    """``values`` as fp16 if every one survives the round trip, else None."""
    half = values.astype(np.float16)
    return half if np.array_equal(half.astype(np.float32), values) else None


def _codes(w: BlockQuantized) -> np.ndarray:
    """The unsigned codes [n, k] (4-bit: 0..15; 8-bit: 0..255), element order along k."""
    n, k = w.shape
    if w.bits == 8:
        return w.packed.reshape(n, -1)[:, :k]
    low, high = w.packed & 0x0F, w.packed >> 4
    return np.stack([low, high], axis=-1).reshape(n, -1)[:, :k]


def _by_group(a: np.ndarray, groups: int) -> np.ndarray:
    """[n, ...] -> [groups, 16, ...], the last group padded with zero rows."""
    pad = groups * GROUP - a.shape[0]
    if pad:
        a = np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)])
    return a.reshape((groups, GROUP, *a.shape[1:]))


def _q4_1_mins(w: BlockQuantized, scales: np.ndarray) -> np.ndarray | None:
    """Q4_1's fp16 ``m`` (value = d * q + m), if it gives back ``w.offsets`` exactly."""
    assert w.offsets is not None
    mins = _fp16_exact((w.offsets - np.float32(8) * w.scales).astype(np.float32))
    if mins is None or not np.array_equal(
            mins.astype(np.float32) + np.float32(8) * scales.astype(np.float32), w.offsets):
        return None
    return mins


def _format(w: BlockQuantized) -> tuple[str, np.ndarray, np.ndarray | None]:
    """The format that holds ``w`` exactly, its scales and offsets in that format's type."""
    scales = np.asarray(w.scales, np.float32)
    offsets = None if w.offsets is None else np.asarray(w.offsets, np.float32)
    half = _fp16_exact(scales)
    base = "q4" if w.bits == 4 else "q8"
    if half is not None and offsets is None:
        return f"{base}_0", half, None
    if half is not None and w.bits == 4 and offsets is not None:
        mins = _q4_1_mins(w, half)
        if mins is not None:
            return "q4_1", half, mins
    return (f"{base}_0f" if offsets is None else f"{base}_1f"), scales, offsets


def packable(w: BlockQuantized) -> bool:
    """Whether the kernel takes ``w``: 4- or 8-bit codes in 32-wide blocks along K, or
    8-bit codes without offsets in 16-wide ones (Q6_K)."""
    if w.shape[1] % BLOCK:
        return False
    if w.block_size == BLOCK // 2:
        return w.bits == 8 and w.offsets is None
    return w.block_size == BLOCK and w.bits in (4, 8)


def format_of(w: BlockQuantized) -> str | None:
    """The format :func:`pack` would write ``w`` in (without packing it), or None."""
    if not packable(w):
        return None
    return "q8_0h" if w.block_size == BLOCK // 2 else _format(w)[0]


def pack(w: BlockQuantized) -> PackedWeight | None:
    """``w`` in the QMatMul layout, or None if the kernel does not take it."""
    if not packable(w):
        return None
    n, k = w.shape
    groups, blocks = -(-n // GROUP), k // BLOCK
    if w.block_size == BLOCK // 2:  # Q6_K: a float32 scale per 16, two per block
        fmt, scales, offsets = "q8_0h", np.asarray(w.scales, np.float32), None
    else:
        fmt, scales, offsets = _format(w)
    codes = _by_group(_codes(w), groups)  # [g, 16, k]
    if w.bits == 8:
        # [g, r, b, c, i] -> [g, b, c, r, i]: chunk c holds element 4c+i of the 16 rows
        body = codes.reshape(groups, GROUP, blocks, 8, 4).transpose(0, 2, 3, 1, 4)
        body = body.reshape(groups, blocks, 512)
    else:
        # element 8c + 4h + i: h = 0 in the low nibble, h = 1 in the high one
        c = codes.reshape(groups, GROUP, blocks, 4, 2, 4).transpose(0, 2, 3, 1, 4, 5)
        body = (c[..., 0, :] | (c[..., 1, :] << 4)).astype(np.uint8)
        body = body.reshape(groups, blocks, 256)
    parts = [body, _per_block(scales, groups, blocks)]
    if offsets is not None:
        parts.append(_per_block(offsets, groups, blocks))
    data = np.ascontiguousarray(np.concatenate(parts, axis=-1), np.uint8)
    return PackedWeight(data, fmt, n, k)


def _per_block(values: np.ndarray, groups: int, blocks: int) -> np.ndarray:
    """Per-row values (fp16 or float32) [n, blocks] -> the bytes [groups, blocks, 16 * size]
    of each block's 16 rows; or [n, 2 * blocks] (a value per 16 elements) -> per block, the
    16 rows' values of its first 16 elements, then of its second 16."""
    halves = values.reshape(values.shape[0], blocks, -1)  # [n, b, 1 or 2]
    by = _by_group(halves, groups).transpose(0, 2, 3, 1)  # [g, b, half, 16]
    return np.ascontiguousarray(by).view(np.uint8).reshape(groups, by.shape[1], -1)
