"""Weights in the ``uniun.QMatMul`` layout: GGUF's own Q4_0 / Q4_1 / Q8_0 blocks, regrouped.

Why apart from the graph builder: this is the one place that knows the byte layout the
C kernel reads (``models/qmatmul.c`` documents it: rows in groups of 16; per
group and 32-wide block, the codes of the 16 rows interleaved four elements at a time,
then their fp16 scales and, for Q4_1, their fp16 minimums). Everything here is numpy and
runs once, at conversion.

Only blocks the layout holds *exactly* are packed: a scale or minimum that fp16 cannot
hold (a K-quant's ``d * sc`` product, or a folded 1/sqrt(head_dim) that underflows) makes
:func:`pack` return ``None``, and the builder keeps ``MatMulNBits`` for that weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from uniun.models.convert.decoder_spec import BlockQuantized

__all__ = ["BLOCK", "FORMATS", "GROUP", "PackedWeight", "pack"]

GROUP = 16  # rows per group
BLOCK = 32  # elements per block along K
FORMATS = ("q4_0", "q4_1", "q8_0")


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
    """The unsigned codes [n, k] (4-bit: 0..15; 8-bit: q + 128), element order along k."""
    n, k = w.shape
    if w.bits == 8:
        return w.packed.reshape(n, -1)[:, :k]
    low, high = w.packed & 0x0F, w.packed >> 4
    return np.stack([low, high], axis=-1).reshape(n, -1)[:, :k]


def _by_group(a: np.ndarray, groups: int) -> np.ndarray:
    """[n, ...] -> [groups, 16, ...], the last group padded with zero rows."""
    pad = groups * GROUP - a.shape[0]
    if pad:
        a = np.concatenate([a, np.zeros((pad,) + a.shape[1:], a.dtype)])
    return a.reshape((groups, GROUP) + a.shape[1:])


def pack(w: BlockQuantized) -> PackedWeight | None:
    """``w`` in the QMatMul layout, or None if the layout cannot hold it exactly."""
    n, k = w.shape
    if w.block_size != BLOCK or k % BLOCK or w.bits not in (4, 8):
        return None
    if w.bits == 8 and w.offsets is not None:
        return None
    scales = _fp16_exact(np.asarray(w.scales, np.float32))
    if scales is None:
        return None
    mins = None
    if w.offsets is not None:  # value = (q - 8) * d + offset = d * q + m, m = offset - 8 d
        m = (np.asarray(w.offsets, np.float32) - np.float32(8) * w.scales).astype(np.float32)
        mins = _fp16_exact(m)
        if mins is None or not np.array_equal(
                mins.astype(np.float32) + np.float32(8) * scales.astype(np.float32), w.offsets):
            return None
    groups, blocks = -(-n // GROUP), k // BLOCK
    codes = _by_group(_codes(w), groups)  # [g, 16, k]
    if w.bits == 8:
        fmt = "q8_0"
        # [g, r, b, c, i] -> [g, b, c, r, i]: chunk c holds element 4c+i of the 16 rows
        body = codes.reshape(groups, GROUP, blocks, 8, 4).transpose(0, 2, 3, 1, 4)
        body = body.reshape(groups, blocks, 512)
    else:
        fmt = "q4_0" if mins is None else "q4_1"
        # element 8c + 4h + i: h = 0 in the low nibble, h = 1 in the high one
        c = codes.reshape(groups, GROUP, blocks, 4, 2, 4).transpose(0, 2, 3, 1, 4, 5)
        body = (c[..., 0, :] | (c[..., 1, :] << 4)).astype(np.uint8)
        body = body.reshape(groups, blocks, 256)
    parts = [body, _scales_by_block(scales, groups)]
    if mins is not None:
        parts.append(_scales_by_block(mins, groups))
    data = np.ascontiguousarray(np.concatenate(parts, axis=-1), np.uint8)
    return PackedWeight(data, fmt, n, k)


def _scales_by_block(half: np.ndarray, groups: int) -> np.ndarray:
    """fp16 [n, blocks] -> the bytes [groups, blocks, 32] of each block's 16 values."""
    by = _by_group(half, groups).transpose(0, 2, 1)  # [g, b, 16]
    return np.ascontiguousarray(by).view(np.uint8).reshape(groups, by.shape[1], 32)
