"""GGUF tensor types -> the weights the graph runs: which types, and the exact mapping.

Every supported block type is a sum over blocks of ``scale * code + offset`` with an
integer code, so it maps *exactly* onto :class:`BlockQuantized` (``MatMulNBits`` with
the symmetric kernel, plus ``blocksum(x) @ offsets.T`` when blocks have a min; see
``decoder_spec``). The table, from docs/models.md:

=====  ======================================  =========================================
type   GGUF value                              MatMulNBits form (bits / block)
=====  ======================================  =========================================
Q4_0   d * (q - 8), q 4-bit, blocks of 32      4 / 32, code q, scale d
Q4_1   d * q + m                               4 / 32, code q, scale d, offset m + 8d
Q5_0   d * (q - 16), q 5-bit                   8 / 32, code q + 112, scale d
Q5_1   d * q + m                               8 / 32, code q + 112, scale d, offset m + 16d
Q8_0   d * q, q int8                           8 / 32, code q + 128, scale d
Q4_K   d*sc_j * q - dmin*m_j, 6-bit sc/m per   4 / 32, code q, scale d*sc_j,
       32-value sub-block of a 256 super-block      offset 8*d*sc_j - dmin*m_j
Q5_K   as Q4_K with a 5-bit q                  8 / 32, code q + 112,
                                                    offset 16*d*sc_j - dmin*m_j
Q6_K   d*sc_j * (q - 32), int8 sc per 16       8 / 16, code q + 96, scale d*sc_j
F16    half floats                             float32 matrix (exact)
BF16   bfloat16                                float32 matrix (exact)
F32    floats                                  float32 matrix
=====  ======================================  =========================================

5-bit codes ride in 8-bit ``MatMulNBits`` because onnxruntime has no 5-bit kernel:
exact, at 8 bits of storage per weight. Codes are centred on the kernel's zero point
(128 for 8 bits, 8 for 4) so the offsets stay small: with ``code = q`` the kernel's
``(q - 128) * d`` and an offset of ``+128 d`` would cancel, and the int8 activations'
rounding error would come back multiplied by 128 (a visible part of the logit range).
The products d*sc (f16 x 6 bit) are exact in float32; Q4_K's offset ``8*d*sc - dmin*m``
is one float32 rounding of an exact value.

How codes are found: Q8_0's are its int8 bytes; for the others, rather than re-deriving
each bit layout, :func:`_codes` runs the
``gguf`` package's own dequantizer on a copy of the blocks whose scales are set to 1 and
mins to 0, which returns the integer codes themselves; the scales and mins are read from
their documented byte offsets. Any other type (Q2_K, Q3_K, the IQ and TQ types, ...) is
refused by name: :class:`UnsupportedTensor`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from uniun.models.convert.decoder_spec import BlockQuantized, Weight

__all__ = ["SUPPORTED_TYPES", "UnsupportedTensor", "to_weight", "unsupported_types"]

SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                   "Q4_K", "Q5_K", "Q6_K")
_QK_K = 256
_ROWS_PER_CHUNK = 8192  # bounds the temporary float copies of large matrices


class UnsupportedTensor(ValueError):
    """A tensor of a type (or shape) we do not map; the message names both."""


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    return blocks[:, start:start + 2].copy().view(np.float16)[:, 0].astype(np.float32)


def _set_f16(blocks: np.ndarray, start: int, value: float) -> None:
    blocks[:, start:start + 2] = np.array([value], np.float16).view(np.uint8)


def _codes(kind: Any, blocks: np.ndarray, unit: dict[int, float], scale_bytes: slice | None,
           scale_fill: bytes) -> np.ndarray:
    """Integer codes of ``blocks`` (one row per block): dequantize with unit scales."""
    from gguf.quants import dequantize

    probe = blocks.copy()
    for start, value in unit.items():
        _set_f16(probe, start, value)
    if scale_bytes is not None:
        probe[:, scale_bytes] = np.frombuffer(scale_fill, np.uint8)
    return np.rint(dequantize(probe, kind)).astype(np.int16).reshape(len(blocks), -1)


def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: per-32 sub-block scale d*sc and min dmin*m, [n_blocks, 8] each."""
    from gguf.quants import Q4_K

    sc, m = Q4_K.get_scale_min(blocks[:, 4:16].copy())
    d, dmin = _f16(blocks, 0)[:, None], _f16(blocks, 2)[:, None]
    return d * sc.astype(np.float32), dmin * m.astype(np.float32)


# Q4_K scale bytes with every sc = 1 and every m = 0 (see gguf's Q4_K.get_scale_min).
_K_UNIT = bytes([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1])


def _map_rows(name: str, raw: np.ndarray, rows: int, cols: int) -> BlockQuantized:
    """The blocks of ``rows`` rows of type ``name`` as a :class:`BlockQuantized`."""
    from gguf import GGMLQuantizationType as Q

    kind = Q[name]
    per_row = raw.reshape(rows, -1)
    size = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34,
            "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[name]
    blocks = per_row.reshape(-1, size)
    offsets = None
    if name == "Q8_0":  # the common big one (embeddings): read the int8 codes directly
        codes = blocks[:, 2:34].copy().view(np.int8).astype(np.int16)
        scales = _f16(blocks, 0)[:, None]
        bits, block = 8, 32
        codes = codes + 128
    elif name in ("Q4_0", "Q5_0"):
        codes = _codes(kind, blocks, {0: 1.0}, None, b"")
        scales = _f16(blocks, 0)[:, None]
        bits, block = (4, 32) if name == "Q4_0" else (8, 32)
        codes = codes + {"Q4_0": 8, "Q5_0": 16 + 112}[name]
    elif name in ("Q4_1", "Q5_1"):
        codes = _codes(kind, blocks, {0: 1.0, 2: 0.0}, None, b"")
        d, m = _f16(blocks, 0)[:, None], _f16(blocks, 2)[:, None]
        bits, block, scales = (4, 32, d) if name == "Q4_1" else (8, 32, d)
        shift = 8 if name == "Q4_1" else 16  # centre of q's range; code = q - shift + zero
        codes = codes + (2 ** (bits - 1) - shift)
        offsets = m + np.float32(shift) * d
    elif name in ("Q4_K", "Q5_K"):
        codes = _codes(kind, blocks, {0: 1.0, 2: 0.0}, slice(4, 16), _K_UNIT)
        scales, mins = _k_scales(blocks)
        bits, block = (4, 32) if name == "Q4_K" else (8, 32)
        shift = 8 if name == "Q4_K" else 16
        codes = codes + (2 ** (bits - 1) - shift)
        offsets = (np.float64(shift) * scales - mins).astype(np.float32)
    elif name == "Q6_K":
        probe_scales = slice(_QK_K // 2 + _QK_K // 4, _QK_K // 2 + _QK_K // 4 + 16)
        codes = _codes(kind, blocks, {208: 1.0}, probe_scales, bytes([1] * 16)) + 128
        sc = blocks[:, probe_scales].copy().view(np.int8).astype(np.float32)
        scales = _f16(blocks, 208)[:, None] * sc
        bits, block = 8, 16
    else:  # pragma: no cover - guarded by SUPPORTED_TYPES
        raise UnsupportedTensor(name)
    n_blocks = cols // block
    grid = codes.astype(np.uint8).reshape(rows, n_blocks, block)
    packed = grid if bits == 8 else (grid[..., 0::2] | (grid[..., 1::2] << 4)).astype(np.uint8)
    scales = np.broadcast_to(scales, (len(blocks), grid.size // len(blocks) // block))
    offsets = (None if offsets is None else np.ascontiguousarray(
        np.broadcast_to(offsets, scales.shape).reshape(rows, n_blocks), np.float32))
    return BlockQuantized(packed=np.ascontiguousarray(packed),
                          scales=np.ascontiguousarray(scales.reshape(rows, n_blocks), np.float32),
                          offsets=offsets, bits=bits, block_size=block, shape=(rows, cols))


def _concat_rows(parts: list[BlockQuantized]) -> BlockQuantized:
    if len(parts) == 1:
        return parts[0]
    merged = BlockQuantized.concat(parts)
    if all(p.offsets is None for p in parts):
        return BlockQuantized(packed=merged.packed, scales=merged.scales, offsets=None,
                              bits=merged.bits, block_size=merged.block_size,
                              shape=merged.shape)
    return merged


def to_weight(name: str, kind_name: str, data: Any, shape: list[int]) -> Weight:
    """One GGUF tensor (``shape`` slowest-first) as float32 or :class:`BlockQuantized`.

    Matrices keep their blocks; vectors (norms, biases) are always float32.
    """
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    if kind_name not in SUPPORTED_TYPES:
        raise UnsupportedTensor(
            f"tensor {name!r} has type {kind_name}, which is not supported "
            f"(supported: {', '.join(SUPPORTED_TYPES)})")
    if kind_name == "F32":
        return np.asarray(data, np.float32).reshape(shape)
    if kind_name in ("F16", "BF16") or len(shape) != 2:
        return dequantize(np.asarray(data), Q[kind_name]).astype(np.float32).reshape(shape)
    rows, cols = shape
    raw = np.asarray(data).reshape(rows, -1)
    parts = [_map_rows(kind_name, raw[r:r + _ROWS_PER_CHUNK], min(_ROWS_PER_CHUNK, rows - r),
                       cols) for r in range(0, rows, _ROWS_PER_CHUNK)]
    return _concat_rows(parts)


def unsupported_types(reader: Any) -> list[str]:
    """``"name (TYPE)"`` for each tensor of a type :func:`to_weight` refuses."""
    from gguf import GGMLQuantizationType as Q

    return [f"{t.name} ({Q(t.tensor_type).name})" for t in reader.tensors
            if Q(t.tensor_type).name not in SUPPORTED_TYPES]
