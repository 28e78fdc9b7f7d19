"""First-run samples are written once, never over a user's files; search ranking."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from uniun.actors.producers.gana_schedule import load_ganas
from uniun.actors.producers.samples import SAMPLE_NOTES, ensure_samples
from uniun.runtime.commands.search import rank


def test_samples_are_written_only_where_nothing_exists(tmp_path: Path) -> None:
    notes, ganas = tmp_path / "notes", tmp_path / "ganas.toml"
    written = ensure_samples(notes, ganas)
    assert len(written) == len(SAMPLE_NOTES) + 1
    assert [g.id for g in load_ganas(ganas)] == ["daily-tip", "word-of-the-day"]
    (notes / "welcome.md").unlink()  # the user deletes a sample: it does not come back
    assert ensure_samples(notes, ganas) == []
    assert not (notes / "welcome.md").exists()


def test_a_users_own_notes_folder_gets_no_samples(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "mine.md").write_text("mine")
    ganas = tmp_path / "ganas.toml"
    ganas.write_text("")
    assert ensure_samples(notes, ganas) == []
    assert sorted(p.name for p in notes.iterdir()) == ["mine.md"] and ganas.read_text() == ""


def test_rank_orders_by_cosine_and_refuses_other_dimensions() -> None:
    matrix = np.array([[1, 0, 0], [0.6, 0.8, 0], [0, 0, 1]], dtype=np.float32)
    query = np.array([0.8, 0.6, 0], dtype=np.float32)
    assert [i for i, _ in rank(query, matrix, 2)] == [1, 0]
    assert rank(query, np.zeros((0, 3), np.float32), 5) == []
    with pytest.raises(ValueError, match="different model"):
        rank(np.ones(4, np.float32), matrix, 1)
