"""Per-job KV state, owned by the caller: what "pause, don't discard" parks.

A job's state has two halves, kept apart on purpose:

* :class:`JobProgress` — everything that does not depend on a loaded model session:
  prompt ids, generated ids, the text already streamed, sampling parameters and the
  effective seed, stop rules, ``static_prefix`` (how many leading positions are the
  shared system prompt). It is small and msgpack/JSON-safe (:meth:`JobProgress.to_record`),
  so a job can always be resumed from it alone by *recompute* (re-prefill of prompt +
  generated ids), even on a freshly started runner process.
* :class:`KVCache` — the keys and values for positions ``[0, length)``, one
  ``(key, value)`` pair of float32 arrays ``[1, kv_heads, length, head_dim]`` per layer
  (the Hugging Face / optimum decoder layout). Arrays coming out of the session are
  zero-copy views of onnxruntime's output buffers; nothing here ever writes into them, so
  a snapshot is a matter of keeping references, and a KV can be shared by readers.

:class:`ParkedState` joins the two for a paused job. Its KV can be trimmed to the static
prefix (:meth:`ParkedState.evict_to_prefix`), dropped (:meth:`ParkedState.drop_kv`),
spilled to one file under ``run_dir()/snapshots`` (:meth:`ParkedState.spill`) and read
back, also by another process (:meth:`ParkedState.load`). Whatever happens to the KV,
the progress stays, so no generated token is ever lost: resume feeds the positions the
KV lacks — one token after a full snapshot, the tail after a partial eviction,
everything after a drop.

Spill file format (``.kvsnap``, little-endian)::

    b"UNIUNKV1" | u32 header length | header JSON | payload
    header = {"version": 1, "progress": <record>, "kv": null | {"length", "layers",
              "kv_heads", "head_dim", "dtype": "float32"}, "crc32": <payload crc>}
    payload = for each layer: key bytes then value bytes, C order

No pickle anywhere: a spill file from a bad disk or a bad actor can fail to load, but
cannot run code. A file that fails its checksum raises :class:`SnapshotCorrupt`; the
caller then resumes by recompute from the progress it still has.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from uniun.models.sampling import SamplingParams

__all__ = ["JobProgress", "KVBuffer", "KVCache", "ParkedState", "SnapshotCorrupt"]

_MAGIC = b"UNIUNKV1"
_VERSION = 1


class SnapshotCorrupt(ValueError):
    """A spilled snapshot cannot be read back (truncated, wrong magic, bad checksum)."""


@dataclass
class JobProgress:
    """The session-independent state of one generation (see module doc)."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0  # the effective seed (SamplingParams.seed, or one drawn at start)
    generated_ids: list[int] = field(default_factory=list)
    text: str = ""  # text already handed to the caller (streamed)
    stop: tuple[str, ...] = ()
    eos_ids: tuple[int, ...] = ()
    static_prefix: int = 0  # leading prompt positions worth keeping (system prompt)
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length"
    job_id: str | None = None
    model_id: str = ""
    # The job's output format (models/constrain.py), None = free text. Travels with the
    # progress so a resumed or recomputed job rebuilds its grammar state by replay.
    format: dict[str, Any] | None = None
    # Log-probabilities per token with this many alternatives (0-20); None = none.
    logprobs: int | None = None

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.generated_ids

    @property
    def total_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.generated_ids)

    def to_record(self) -> dict[str, Any]:
        """A plain map (msgpack- and JSON-safe) that :meth:`from_record` turns back."""
        return {
            "prompt_ids": list(self.prompt_ids), "max_new_tokens": self.max_new_tokens,
            "sampling": self.sampling.to_map(), "seed": str(self.seed),
            "generated_ids": list(self.generated_ids), "text": self.text,
            "stop": list(self.stop), "eos_ids": list(self.eos_ids),
            "static_prefix": self.static_prefix, "finished": self.finished,
            "finish_reason": self.finish_reason, "job_id": self.job_id,
            "model_id": self.model_id, "format": self.format, "logprobs": self.logprobs,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> JobProgress:
        try:
            return cls(
                prompt_ids=[int(t) for t in record["prompt_ids"]],
                max_new_tokens=int(record["max_new_tokens"]),
                sampling=SamplingParams.coerce(record.get("sampling")),
                seed=int(record.get("seed", 0)),
                generated_ids=[int(t) for t in record.get("generated_ids", [])],
                text=str(record.get("text", "")),
                stop=tuple(record.get("stop", ())),
                eos_ids=tuple(int(t) for t in record.get("eos_ids", ())),
                static_prefix=int(record.get("static_prefix", 0)),
                finished=bool(record.get("finished", False)),
                finish_reason=record.get("finish_reason"),
                job_id=record.get("job_id"),
                model_id=str(record.get("model_id", "")),
                format=dict(record["format"]) if record.get("format") else None,
                logprobs=None if record.get("logprobs") is None else int(record["logprobs"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a job progress record: {exc}") from exc


class KVBuffer:
    """Preallocated keys/values [1, kv_heads, capacity, head_dim] per layer, written in place.

    Why: with ``GroupQueryAttention`` the session binds ``present`` to the very buffer it
    feeds as ``past``, so a step writes its one new position and copies nothing. Many
    :class:`KVCache` objects may view one buffer (a snapshot is a view of the first
    ``length`` positions); positions below ``written`` are never written again, so
    every view stays valid. Only a cache whose length equals ``written`` may append in
    place; any other (an older snapshot, a shared prefix) is copied into a new buffer
    first (see :meth:`appendable`), so two jobs never write the same positions.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int,
                 wrap: Any = None, dtype: Any = np.float32) -> None:
        self.capacity = int(capacity)
        # One block, viewed per layer: one allocation large enough to be its own mapping,
        # so positions never written take no memory, and freeing it returns it all.
        block = np.zeros((2 * layers, 1, kv_heads, self.capacity, head_dim), dtype)
        self.arrays = list(block)  # [k0, v0, k1, v1, ...], each C-contiguous
        # OrtValues over the same memory (no copy), when the session gives a wrapper.
        self.ort_values = [wrap(a) for a in self.arrays] if wrap is not None else None
        self.written = 0  # positions [0, written) hold data; the rest is free

    @classmethod
    def over(cls, arrays: list[np.ndarray], wrap: Any = None) -> KVBuffer:
        """A buffer over arrays that already exist (C-contiguous [1, kv_heads, capacity,
        head_dim] each, e.g. one row of a batch's KV pool, models/batch.py), written from 0."""
        buf = cls.__new__(cls)
        buf.capacity = int(arrays[0].shape[2])
        buf.arrays = list(arrays)
        buf.ort_values = [wrap(a) for a in buf.arrays] if wrap is not None else None
        buf.written = 0
        return buf

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def appendable(self, length: int, new: int) -> bool:
        """Whether a cache of ``length`` positions may write ``new`` more here in place."""
        return length == self.written and length + new <= self.capacity

    def view(self, length: int) -> KVCache:
        """A cache of the first ``length`` positions (views, no copy)."""
        a = self.arrays
        return KVCache([(a[2 * i][:, :, :length, :], a[2 * i + 1][:, :, :length, :])
                        for i in range(len(a) // 2)], buffer=self)


@dataclass
class KVCache:
    """Keys/values for positions ``[0, length)``: per layer ``(key, value)`` float32 arrays."""

    layers: list[tuple[np.ndarray, np.ndarray]]
    # The same buffers as onnxruntime OrtValues ([k0, v0, k1, v1, ...]), when they came
    # from the session: fed back as they are, they save re-wrapping 2 x layers arrays
    # per step. Purely a cache; everything else uses ``layers``.
    ort_values: list[Any] | None = field(default=None, repr=False, compare=False)
    # The preallocated buffer ``layers`` are views of, when the session updates KV in
    # place (see :class:`KVBuffer`); None for compact arrays.
    buffer: KVBuffer | None = field(default=None, repr=False, compare=False)

    @property
    def length(self) -> int:
        return int(self.layers[0][0].shape[2]) if self.layers else 0

    @property
    def nbytes(self) -> int:
        """Memory this cache keeps alive: its whole buffer when it views one."""
        if self.buffer is not None:
            return self.buffer.nbytes
        return sum(k.nbytes + v.nbytes for k, v in self.layers)

    @property
    def dtype(self) -> np.dtype:
        return self.layers[0][0].dtype if self.layers else np.dtype(np.float32)

    def compact(self, dtype: Any = None) -> KVCache:
        """Contiguous copies of exactly ``length`` positions (optionally in ``dtype``,
        e.g. float16 for parking): what a parked or cached state should hold, rather
        than a view that keeps a whole preallocated buffer alive."""
        dtype = dtype or self.dtype
        return KVCache([(np.ascontiguousarray(k, dtype=dtype), np.ascontiguousarray(v, dtype=dtype))
                        for k, v in self.layers])

    @property
    def shape(self) -> tuple[int, int, int]:
        """(layers, kv_heads, head_dim): what must match a model to be resumed on it."""
        key = self.layers[0][0]
        return len(self.layers), int(key.shape[1]), int(key.shape[3])

    def prefix(self, n: int) -> KVCache:
        """A compact copy of the first ``n`` positions (the original is left alone)."""
        n = max(0, min(n, self.length))
        return KVCache([(np.ascontiguousarray(k[:, :, :n, :]), np.ascontiguousarray(v[:, :, :n, :]))
                        for k, v in self.layers])


class ParkedState:
    """A paused job: its progress plus whatever of its KV was kept (in memory or on disk)."""

    def __init__(self, progress: JobProgress, kv: KVCache | None = None) -> None:
        self.progress = progress
        self.kv: KVCache | None = kv if kv is not None and kv.length > 0 else None
        self.spill_path: Path | None = None
        self._spilled_length = 0

    # -- what is kept -------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes held in memory by the KV (0 once spilled or dropped)."""
        return self.kv.nbytes if self.kv is not None else 0

    @property
    def kv_length(self) -> int:
        """Positions a resume can start from (in memory or in the spill file)."""
        if self.kv is not None:
            return self.kv.length
        return self._spilled_length if self.spill_path is not None else 0

    @property
    def spilled(self) -> bool:
        return self.kv is None and self.spill_path is not None

    @property
    def job_id(self) -> str | None:
        return self.progress.job_id

    def __repr__(self) -> str:
        return (f"ParkedState(job={self.progress.job_id!r}, tokens={self.progress.total_tokens}, "
                f"kv_length={self.kv_length}, nbytes={self.nbytes}, spilled={self.spilled})")

    # -- shrinking ----------------------------------------------------------------
    def evict_to_prefix(self, prefix_tokens: int | None = None) -> int:
        """Keep only the first ``prefix_tokens`` positions (default: the static prefix).

        Returns the bytes freed from memory. A spilled state holds no memory, so it is
        left alone (0 freed).
        """
        if self.kv is None:
            return 0
        n = self.progress.static_prefix if prefix_tokens is None else prefix_tokens
        if n >= self.kv.length:
            return 0
        before = self.kv.nbytes
        self.kv = self.kv.prefix(n) if n > 0 else None
        return before - self.nbytes

    def drop_kv(self) -> int:
        """Forget the KV entirely (memory and spill file); resume will recompute."""
        freed = self.nbytes
        self.kv = None
        self.discard_spill()
        return freed

    # -- disk ---------------------------------------------------------------------
    def spill(self, path: Path) -> Path:
        """Write progress + KV to ``path`` and release the KV's memory. Atomic."""
        kv = self.load_kv()
        write_snapshot(path, self.progress, kv)
        if self.spill_path is not None and self.spill_path != path:
            self.discard_spill()
        self.spill_path = Path(path)
        self._spilled_length = kv.length if kv is not None else 0
        self.kv = None
        return self.spill_path

    def load_kv(self) -> KVCache | None:
        """The kept KV, read from the spill file if it is there (memory is not kept)."""
        if self.kv is not None:
            return self.kv
        if self.spill_path is not None:
            return read_snapshot(self.spill_path)[1]
        return None

    def discard_spill(self) -> None:
        """Delete the spill file, if any (call once the job has resumed or is done)."""
        if self.spill_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.spill_path.unlink()
            self.spill_path = None
            self._spilled_length = 0

    @classmethod
    def load(cls, path: Path) -> ParkedState:
        """Read a spilled state (e.g. in a fresh process); the KV comes back into memory."""
        progress, kv = read_snapshot(Path(path))
        return cls(progress, kv)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ParkedState:
        """A state with no KV at all: resuming it recomputes prompt + generated ids."""
        return cls(JobProgress.from_record(record))

def write_snapshot(path: Path, progress: JobProgress, kv: KVCache | None) -> None:
    """Write one ``.kvsnap`` file atomically (temp file + rename)."""
    path = Path(path)
    crc = 0
    if kv is not None:
        for k, v in kv.layers:
            crc = zlib.crc32(np.ascontiguousarray(k).data, crc)
            crc = zlib.crc32(np.ascontiguousarray(v).data, crc)
        layers, heads, dim = kv.shape
        kv_meta: dict[str, Any] | None = {"length": kv.length, "layers": layers,
                                          "kv_heads": heads, "head_dim": dim, "dtype": "float32"}
    else:
        kv_meta = None
    header = json.dumps({"version": _VERSION, "progress": progress.to_record(),
                         "kv": kv_meta, "crc32": crc}).encode()
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    with open(tmp, "wb") as out:
        out.write(_MAGIC + struct.pack("<I", len(header)) + header)
        if kv is not None:
            for k, v in kv.layers:
                out.write(np.ascontiguousarray(k, dtype=np.float32).data)
                out.write(np.ascontiguousarray(v, dtype=np.float32).data)
    os.replace(tmp, path)


def read_snapshot(path: Path) -> tuple[JobProgress, KVCache | None]:
    """Read a ``.kvsnap`` file; raise :class:`SnapshotCorrupt` if it is not whole."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_MAGIC) + 4)
            if len(head) < len(_MAGIC) + 4 or head[: len(_MAGIC)] != _MAGIC:
                raise SnapshotCorrupt(f"{path}: not a UNIUN KV snapshot")
            (header_len,) = struct.unpack("<I", head[len(_MAGIC):])
            header = json.loads(f.read(header_len))
            if header.get("version") != _VERSION:
                raise SnapshotCorrupt(f"{path}: unsupported snapshot version "
                                      f"{header.get('version')!r}")
            progress = JobProgress.from_record(header["progress"])
            meta = header.get("kv")
            if meta is None:
                return progress, None
            n, layers, heads, dim = (int(meta[k])
                                     for k in ("length", "layers", "kv_heads", "head_dim"))
            each = heads * n * dim
            payload = bytearray(2 * layers * each * 4)
            if f.readinto(payload) != len(payload) or f.read(1):
                raise SnapshotCorrupt(f"{path}: payload has the wrong size")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, SnapshotCorrupt):
            raise
        raise SnapshotCorrupt(f"{path}: {exc}") from exc
    if zlib.crc32(payload) != int(header["crc32"]):
        raise SnapshotCorrupt(f"{path}: checksum mismatch")
    flat = np.frombuffer(payload, dtype=np.float32)
    pairs = []
    for i in range(layers):
        k = flat[(2 * i) * each:(2 * i + 1) * each].reshape(1, heads, n, dim)
        v = flat[(2 * i + 1) * each:(2 * i + 2) * each].reshape(1, heads, n, dim)
        pairs.append((k, v))
    return progress, KVCache(pairs)
