"""The journal-sync bench: both modes run against real scheduler-only runtimes."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from uniun.runtime.bench.journal_sync import filesystem, run


def test_the_bench_measures_both_modes_and_every_submit_is_accepted(tiny_model: str) -> None:
    base = Path(tempfile.mkdtemp(prefix="ujs-", dir="/tmp"))  # short: ipc paths are limited
    try:
        lines: list[str] = []
        result = run(submits=40, singles=3, reps=1, model=tiny_model, base=base,
                     log=lines.append)
        assert not list(base.iterdir())  # the homes are gone
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert set(result["modes"]) == {"normal", "full"} and len(lines) == 2
    for mode in result["modes"].values():
        assert mode["refused"] == 0
        assert mode["burst_submits_per_s"] > 0 and mode["single_submits_per_s"] > 0
        assert set(mode["commit_ms"]) == {"one_submit_ms", "chunk_of_64_ms", "one_token_ms"}
    assert result["filesystem"] == filesystem(Path("/tmp")) != "unknown"
