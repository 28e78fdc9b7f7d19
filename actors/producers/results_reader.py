"""The results store read-only, for a reader that must not write: the console.

The producers own ``$UNIUN_HOME/results.db`` (``actors/producers/results.py``); the
console (``actors/gateway/console_routes.py``, given a reader by ``runtime/http_main.py``)
only reads it, on a read-only connection opened per call (WAL lets readers in
while producers write; a connection per call holds no lock and no file open between
calls, and the calls run in a worker thread, never on the event loop). A store that does
not exist yet (producers off, nothing made) reads as empty, not as an error.

Search is the ``search`` command's: the query embedded by the embedding pool, ranked by
cosine against the notes' embeddings (L2-normalised: a dot product), each hit shown with
the knowledge extracted from its note.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from uniun.actors.producers.results import RESULT_KINDS, list_results, note_embeddings, rank

__all__ = ["COUNTED", "ResultsReader"]

COUNTED = {"knowledge": "knowledge", "card": "deck_cards", "gana": "gana_runs",
           "embedding": "note_embeddings"}  # result kind -> its table
TEXT_CAP = 4000  # characters of one result's text sent to the page


class ResultsReader:
    """Read-only access to one results database (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        if not self.path.exists():
            return []
        db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10.0)
        try:
            db.row_factory = sqlite3.Row
            return db.execute(sql, params).fetchall()
        except sqlite3.OperationalError as err:
            if "no such table" in str(err):  # a store older than this table: nothing yet
                return []
            raise
        finally:
            db.close()

    def counts(self) -> dict[str, int]:
        """Rows of each kind of result (what the page compares to know something landed)."""
        out: dict[str, int] = {}
        for kind, table in COUNTED.items():
            rows = self._query(f"SELECT count(*) AS n FROM {table}")  # fixed table names
            out[kind] = int(rows[0]["n"]) if rows else 0
        return out

    def results(self, kind: str, limit: int) -> list[dict[str, Any]]:
        """Newest first; long texts cut to :data:`TEXT_CAP` characters."""
        if kind not in RESULT_KINDS:
            raise ValueError(f"unknown result kind {kind!r}")
        items = list_results(self._query, kind, limit)
        for item in items:
            for key in ("raw", "text", "content"):
                if isinstance(item.get(key), str) and len(item[key]) > TEXT_CAP:
                    item[key] = item[key][:TEXT_CAP] + "..."
        return items

    def note_embeddings(self) -> tuple[list[str], np.ndarray]:
        return note_embeddings(self._query)

    def search(self, vector: np.ndarray, k: int) -> tuple[list[dict[str, Any]], str | None]:
        """The ``k`` notes most like ``vector`` (the query's embedding), best first, each
        with its knowledge; or no hits and why."""
        paths, matrix = self.note_embeddings()
        if not paths:
            return [], ("no note embeddings yet: the extract producer embeds the notes "
                        "when the embedding pool runs")
        try:
            hits = rank(vector, matrix, k)
        except ValueError as err:
            return [], str(err)
        knowledge = self.knowledge_of([paths[i] for i, _ in hits])
        return [{"note_path": paths[i], "score": round(score, 4),
                 "knowledge": knowledge.get(paths[i])} for i, score in hits], None

    def knowledge_of(self, paths: list[str]) -> dict[str, Any]:
        """The latest parsed knowledge of each note in ``paths`` (None where none parsed)."""
        out: dict[str, Any] = {p: None for p in paths}
        for item in list_results(self._query, "knowledge", 1000):
            path = item.get("note_path")
            if path in out and out[path] is None and isinstance(item.get("parsed"), dict):
                out[path] = item["parsed"]
        return out

