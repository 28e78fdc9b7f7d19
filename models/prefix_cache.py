"""Shared-prefix KV cache: jobs that share a system prompt skip recomputing it.

Entries map a token-id prefix to the KV of exactly those positions. A job whose prompt
starts with a cached prefix begins from that KV and prefills only the rest — the prefix
KV of a causal decoder depends on nothing but the prefix ids, so the result is the
same as a cold prefill (tests check the tokens agree).

Sharing is safe without copies because KV arrays are never written in place: the
decoder reads ``past_key_values`` and returns new ``present`` buffers.

Eviction is least-recently-used under a byte cap. Lookups scan the entries (a handful of
system prompts in practice); the longest matching prefix wins. A hit leaves at least
two prompt positions to feed: the first logits need one, and the prefill is always a
pass of two or more positions (see ``feed_plan``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from uniun.models.kv import KVCache

__all__ = ["PrefixCache"]

DEFAULT_PREFIX_CACHE_BYTES = 64 * 1024 * 1024  # 64 MiB: ~1,400 SmolLM2 positions


class PrefixCache:
    """LRU map ``tuple(token ids) -> KVCache`` under ``max_bytes``."""

    def __init__(self, max_bytes: int = DEFAULT_PREFIX_CACHE_BYTES) -> None:
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[tuple[int, ...], KVCache] = OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, ids: Sequence[int]) -> bool:
        return tuple(ids) in self._entries

    def lookup(self, prompt_ids: Sequence[int]) -> tuple[int, KVCache | None]:
        """The longest cached prefix of ``prompt_ids`` leaving >= 2 positions: (length, kv)."""
        best: tuple[int, ...] | None = None
        n_prompt = len(prompt_ids)
        for key in self._entries:
            n = len(key)
            longer = best is None or n > len(best)
            if n < n_prompt - 1 and longer and tuple(prompt_ids[:n]) == key:
                best = key
        if best is None:
            self.misses += 1
            return 0, None
        self._entries.move_to_end(best)
        self.hits += 1
        return len(best), self._entries[best]

    def put(self, prefix_ids: Sequence[int], kv: KVCache) -> bool:
        """Cache ``kv`` (exactly ``len(prefix_ids)`` positions). False if it cannot fit."""
        key = tuple(int(t) for t in prefix_ids)
        if not key or kv.length != len(key):
            raise ValueError(f"prefix of {len(key)} ids given a KV of {kv.length} positions")
        if kv.nbytes > self.max_bytes:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._entries[key] = kv
        self.nbytes += kv.nbytes
        while self.nbytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.nbytes -= evicted.nbytes
        return True

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0
