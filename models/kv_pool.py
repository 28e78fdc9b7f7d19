"""The KV slots of a decode batch: one block per layer's keys and values, a row per sequence.

Why one block: a batched forward pass takes ``past_key_values.{i}.key`` as one tensor
[rows, kv_heads, capacity, head_dim]; if each sequence kept its own buffer, every step
would gather them into one (a copy of every sequence's KV per token). Here row ``r`` of
every layer *is* sequence ``r``'s KV: the batched pass binds rows ``[0, n)`` as past and
present at once and each row's new position is written in place, at that row's own length
(the attention ops take each row's length from ``attention_mask``). A row is also a
:class:`~uniun.models.kv.KVBuffer` of its own ([1, kv_heads, capacity, head_dim] views), so a
sequence's prefill passes run alone on its row through the ordinary session path, with no
copy when it joins the batch's decode steps.

Copies happen only when a sequence brings KV with it (a resume, a prefix-cache hit), when
the block grows (every row's positions, once per ``KV_CHUNK``), and when a row is moved
down to fill the hole a leaving sequence left (so live rows are always ``[0, n)``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from uniun.models.kv import KVBuffer, KVCache

__all__ = ["KVPool"]


class KVPool:
    """``size`` rows of KV, ``capacity`` positions each, grown in steps of ``chunk``."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, size: int, *, chunk: int,
                 max_positions: int | None, wrap: Any) -> None:
        if size < 1:
            raise ValueError(f"a batch needs at least one row, not {size}")
        self.layers, self.kv_heads, self.head_dim, self.size = layers, kv_heads, head_dim, size
        self.chunk, self.max_positions, self._wrap = chunk, max_positions, wrap
        self.capacity = 0
        self.rows: list[KVBuffer] = []
        self.copied_bytes = 0  # KV bytes copied by loads, moves and growth
        self._block: np.ndarray | None = None
        self._batch_values: dict[int, list[Any]] = {}
        self.ensure(1)

    @property
    def nbytes(self) -> int:
        return int(self._block.nbytes) if self._block is not None else 0

    def _position_bytes(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 4

    def ensure(self, need: int) -> bool:
        """Make every row hold at least ``need`` positions; True when the block grew (the
        rows are new :class:`KVBuffer` objects then, holding what the old ones held)."""
        if need <= self.capacity:
            return False
        capacity = -(-max(need, self.capacity + self.chunk) // self.chunk) * self.chunk
        if self.max_positions:
            capacity = max(need, min(capacity, self.max_positions))
        # One allocation, its own mapping: rows never written take no memory.
        block = np.zeros((2 * self.layers, self.size, self.kv_heads, capacity, self.head_dim),
                         np.float32)
        old, old_rows = self._block, self.rows
        self._block, self.capacity, self._batch_values = block, capacity, {}
        self.rows = [KVBuffer.over([block[a, r:r + 1] for a in range(2 * self.layers)],
                                   self._wrap) for r in range(self.size)]
        if old is not None:
            for r, row in enumerate(old_rows):
                n = row.written
                block[:, r, :, :n, :] = old[:, r, :, :n, :]
                self.rows[r].written = n
                self.copied_bytes += n * self._position_bytes()
        return old is not None

    def view(self, r: int, length: int) -> KVCache:
        """Row ``r``'s first ``length`` positions (views; valid until the row is reused)."""
        return self.rows[r].view(length)

    def load(self, r: int, kv: KVCache | None) -> KVCache | None:
        """Put ``kv`` (a resumed or cached state, any dtype) in row ``r``; its view there."""
        row = self.rows[r]
        row.written = 0
        if kv is None or kv.length == 0:
            return row.view(0)
        self.ensure(kv.length + 1)
        row = self.rows[r]
        for i, (k, v) in enumerate(kv.layers):
            row.arrays[2 * i][:, :, :kv.length, :] = k
            row.arrays[2 * i + 1][:, :, :kv.length, :] = v
        row.written = kv.length
        self.copied_bytes += kv.length * self._position_bytes()
        return row.view(kv.length)

    def move(self, src: int, dst: int) -> None:
        """Row ``src``'s positions into row ``dst`` (``src`` is free afterwards)."""
        assert self._block is not None
        n = self.rows[src].written
        self._block[:, dst, :, :n, :] = self._block[:, src, :, :n, :]
        self.rows[dst].written, self.rows[src].written = n, 0
        self.copied_bytes += n * self._position_bytes()

    def release(self, r: int) -> None:
        self.rows[r].written = 0

    def batch_values(self, n: int) -> list[Any]:
        """OrtValues over rows ``[0, n)`` of every layer ([k0, v0, k1, ...]), made once per
        row count and block."""
        values = self._batch_values.get(n)
        if values is None:
            assert self._block is not None
            values = [self._wrap(self._block[a, :n]) for a in range(2 * self.layers)]
            self._batch_values[n] = values
        return values
