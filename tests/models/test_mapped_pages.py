"""Mapped weight pages are given back after load, and what is read later still reads right.

Real mappings of a real file (``mmap``), read through ``/proc/self/smaps``: what the
runner does to onnxruntime's mappings of ``model.onnx.data`` (models/mapped_pages.py).
The mappings are read by slicing and indexing (copies), so no buffer is exported and
each test can close its mappings whatever happened.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from uniun.models import mapped_pages
from uniun.models.mapped_pages import (
    code_mappings,
    file_mappings,
    release_code_pages,
    release_mapped_pages,
)

SIZE = 8 << 20
HALF = SIZE // 2
PRIVATE_RW = {"flags": mmap.MAP_PRIVATE, "prot": mmap.PROT_READ | mmap.PROT_WRITE}


@contextmanager
def mapped_file(folder: Path, name: str = "weights.bin", mode: dict | None = None
                ) -> Iterator[tuple[bytes, mmap.mmap, mmap.mmap]]:
    """A fresh 8 MB file, mapped as onnxruntime maps initializers: one private mapping
    per tensor; here the first half and the second half. (``mode``: how a loader maps
    a shared library's code instead.)"""
    data = np.random.default_rng(7).integers(0, 255, SIZE, dtype=np.uint8).tobytes()
    path = folder / name
    path.write_bytes(data)
    mode = mode or PRIVATE_RW
    with path.open("rb") as f:
        first = mmap.mmap(f.fileno(), HALF, **mode)
        second = mmap.mmap(f.fileno(), HALF, offset=HALF, **mode)
        try:
            yield data, first, second
        finally:
            first.close()
            second.close()


def _resident_kb(folder: Path) -> int:
    return sum(m.rss_kb for m in file_mappings(folder))


def test_read_pages_are_given_back_and_untouched_ones_come_back_page_by_page(
        tmp_path: Path) -> None:
    """The first half is read at load (prepacked); the second, an embedding, is read
    later a row at a time."""
    with mapped_file(tmp_path) as (data, loaded, lazily):
        assert loaded[:] == data[:HALF]  # reads every page of the first mapping
        before = _resident_kb(tmp_path)
        assert before >= HALF // 1024 // 2
        assert release_mapped_pages(tmp_path) >= before * 1024 // 2
        assert _resident_kb(tmp_path) < before // 4
        rows = [13, 4096 * 7 + 5, HALF - 1]
        assert [lazily[i] for i in rows] == [data[HALF + i] for i in rows]
        # Three rows: a few 4 KB pages, not the 2 MB folios the fresh file was cached in.
        assert _resident_kb(tmp_path) <= 3 * 64
        assert [loaded[i] for i in rows] == [data[i] for i in rows]


def test_a_file_read_in_place_keeps_its_pages(tmp_path: Path) -> None:
    """QMatMul reads its blocks from the mapping every pass: they are not given back."""
    with mapped_file(tmp_path, "model.qblocks.data") as (data, blocks, _), \
            mapped_file(tmp_path) as (other_data, copied, _):
        assert blocks[:] == data[:HALF] and copied[:] == other_data[:HALF]
        kept = sum(m.rss_kb for m in file_mappings(tmp_path)
                   if m.path.endswith("model.qblocks.data"))
        assert kept >= HALF // 1024 // 2
        release_mapped_pages(tmp_path, read_in_place=("model.qblocks.data",))
        after = {Path(m.path).name: 0 for m in file_mappings(tmp_path)}
        for m in file_mappings(tmp_path):
            after[Path(m.path).name] += m.rss_kb
        assert after["model.qblocks.data"] >= kept  # still resident
        assert after["weights.bin"] < HALF // 1024 // 4  # the copied one was given back
        assert blocks[HALF - 1] == data[HALF - 1]


def test_a_mapping_with_written_pages_is_left_alone(tmp_path: Path) -> None:
    """MADV_DONTNEED would throw a private written page away: the write must survive."""
    with mapped_file(tmp_path) as (data, loaded, _):
        loaded[100] = (data[100] + 1) % 256
        release_mapped_pages(tmp_path)
        assert loaded[100] == (data[100] + 1) % 256


def test_other_folders_mappings_are_not_touched(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with mapped_file(tmp_path / "a") as (data, loaded, _):
        assert loaded[:] == data[:HALF]
        before = _resident_kb(tmp_path / "a")
        assert release_mapped_pages(tmp_path / "b") == 0
        assert _resident_kb(tmp_path / "a") == before


def test_code_pages_are_given_back_and_what_runs_again_comes_back_page_by_page(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library's code mapped as the loader maps it (private, read + execute): what
    load-time code read is dropped, and a later read gets the same bytes back as small
    pages. Every other library of this process (Python's own code) is released too, and
    the test going on is the proof that code comes back."""
    monkeypatch.setattr(mapped_pages, "_code_evicted", False)  # as in a fresh runner
    code = {"flags": mmap.MAP_PRIVATE, "prot": mmap.PROT_READ | mmap.PROT_EXEC}
    with mapped_file(tmp_path, "libfake.so.1", code) as (data, run_once, _):
        assert run_once[:] == data[:HALF]
        mine = [m for m in code_mappings() if m.path.startswith(str(tmp_path))]
        assert [m.perms for m in mine] == ["r-xp", "r-xp"]
        before = sum(m.rss_kb for m in mine)
        assert before >= HALF // 1024 // 2
        assert release_code_pages() >= before * 1024 // 2
        rows = [13, 4096 * 7 + 5, HALF - 1]
        assert [run_once[i] for i in rows] == [data[i] for i in rows]
        after = sum(m.rss_kb for m in code_mappings() if m.path.startswith(str(tmp_path)))
        assert after <= 3 * 64


def test_data_files_are_not_code(tmp_path: Path) -> None:
    """Weights mapped read-write (private) are not taken for a library's code."""
    with mapped_file(tmp_path, "weights.so") as (data, loaded, _):
        assert loaded[:] == data[:HALF]
        assert not [m for m in code_mappings() if m.path.startswith(str(tmp_path))]
