"""Mapped weight pages are given back after load, and what is read later still reads right.

Real mappings of a real file (``mmap``), read through ``/proc/self/smaps``: what the
runner does to onnxruntime's mappings of ``model.onnx.data`` (models/mapped_pages.py).
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from uniun.models.mapped_pages import file_mappings, release_mapped_pages

SIZE = 8 << 20


def _mapped_file(folder: Path) -> tuple[np.ndarray, mmap.mmap, object]:
    data = np.random.default_rng(7).integers(0, 255, SIZE, dtype=np.uint8)
    path = folder / "weights.bin"
    path.write_bytes(data.tobytes())
    f = path.open("rb")
    mapped = mmap.mmap(f.fileno(), SIZE, flags=mmap.MAP_PRIVATE,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return data, mapped, f


def test_read_pages_are_given_back_and_untouched_ones_come_back_page_by_page(
        tmp_path: Path) -> None:
    """As onnxruntime maps a model: one mapping per initializer. The first half is read
    at load (prepacked); the second (an embedding) is read later, a row at a time."""
    data, mapped, f = _mapped_file(tmp_path)
    half = SIZE // 2
    lazily = mmap.mmap(f.fileno(), half, offset=half, flags=mmap.MAP_PRIVATE,  # type: ignore[attr-defined]
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        loaded = np.frombuffer(mapped, np.uint8)[:half]
        assert int(loaded.sum(dtype=np.int64)) == int(data[:half].sum(dtype=np.int64))
        before = sum(m.rss_kb for m in file_mappings(tmp_path))
        assert before >= half // 1024 // 2
        assert release_mapped_pages(tmp_path) >= before * 1024 // 2
        assert sum(m.rss_kb for m in file_mappings(tmp_path)) < before // 4
        rows = [13, 4096 * 7 + 5, half - 1]
        view = np.frombuffer(lazily, np.uint8)
        assert [int(view[i]) for i in rows] == [int(data[half + i]) for i in rows]
        # Three rows: a few 4 KB pages, not the 2 MB folios the fresh file was cached in.
        assert sum(m.rss_kb for m in file_mappings(tmp_path)) <= 3 * 64
        assert [int(loaded[i]) for i in rows] == [int(data[i]) for i in rows]
        del loaded, view
    finally:
        lazily.close()
        mapped.close()
        f.close()  # type: ignore[attr-defined]


def test_a_mapping_with_written_pages_is_left_alone(tmp_path: Path) -> None:
    """MADV_DONTNEED would throw a private written page away: the write must survive."""
    data, mapped, f = _mapped_file(tmp_path)
    try:
        mapped[100] = (int(data[100]) + 1) % 256
        release_mapped_pages(tmp_path)
        assert mapped[100] == (int(data[100]) + 1) % 256
    finally:
        mapped.close()
        f.close()  # type: ignore[attr-defined]


def test_other_folders_mappings_are_not_touched(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    data, mapped, f = _mapped_file(tmp_path / "a")
    try:
        np.frombuffer(mapped, np.uint8).sum()
        before = sum(m.rss_kb for m in file_mappings(tmp_path / "a"))
        assert release_mapped_pages(tmp_path / "b") == 0
        assert sum(m.rss_kb for m in file_mappings(tmp_path / "a")) == before
    finally:
        mapped.close()
        f.close()  # type: ignore[attr-defined]
