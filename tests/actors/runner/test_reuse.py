"""What a runner may reuse: snapshots that extend the streamed tokens, spill files."""

from __future__ import annotations

from pathlib import Path

from uniun.actors.runner.reuse import continues, find_orphans, peek_progress
from uniun.models.kv import JobProgress, ParkedState, write_snapshot


def parked(generated: list[int], model: str = "tiny-1") -> ParkedState:
    return ParkedState(JobProgress(prompt_ids=[1, 2, 3], max_new_tokens=10, job_id="j",
                                   generated_ids=list(generated), text="abcd", model_id=model))


def test_a_snapshot_that_ran_further_is_cut_back_to_the_streamed_tokens() -> None:
    state = parked([7, 8, 9, 10])
    assert continues(state, "tiny-1", [7, 8], "ab")
    assert state.progress.generated_ids == [7, 8] and state.progress.text == "ab"


def test_the_same_tokens_continue_unchanged() -> None:
    state = parked([7, 8])
    assert continues(state, "tiny-1", [7, 8], "ab")
    assert state.progress.text == "abcd"  # untouched: nothing to cut


def test_other_tokens_or_another_model_do_not_continue() -> None:
    assert not continues(parked([7, 8]), "tiny-1", [7, 9], "ax")
    assert not continues(parked([7]), "tiny-1", [7, 8], "ab")  # behind what was streamed
    assert not continues(parked([7, 8]), "tiny-2", [7, 8], "ab")


def test_spill_files_are_found_by_job_id_and_junk_is_removed(tmp_path: Path) -> None:
    progress = parked([7]).progress
    write_snapshot(tmp_path / "a.kvsnap", progress, None)
    (tmp_path / "junk.kvsnap").write_bytes(b"not a snapshot")
    assert peek_progress(tmp_path / "a.kvsnap")["generated_ids"] == [7]
    assert find_orphans(tmp_path) == {"j": tmp_path / "a.kvsnap"}
    assert not (tmp_path / "junk.kvsnap").exists()
    assert find_orphans(tmp_path / "missing") == {}
