"""The crash marker (actors/scheduler/crash_marker.py): deaths counted per request.

A scheduler's death during a validation is what it leaves behind: the slot written and
never blanked. :func:`die_validating` leaves exactly that (the marker's file closed
with the slot still set, as a killed process's would be); one test kills a real process
instead, to show the write survives a SIGKILL without a flush.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from uniun.actors.scheduler.crash_marker import (
    HEADER,
    SLOT_BYTES,
    CrashMarker,
    fingerprint,
)
from uniun.protocol.errors import ErrorCode, ProtocolError


def submit(job_id: str = "j1", **job: Any) -> dict[str, Any]:
    job = {"job_id": job_id, "kind": "chat", "prompt": "hi",
           "format": {"type": "json_object"}, **job}
    return {"v": 1, "type": "submit", "id": f"c-{job_id}", "job": job}


def die_validating(path: Path, raw: dict[str, Any]) -> None:
    """A scheduler starts on ``path``, begins validating ``raw`` and dies there."""
    marker = CrashMarker(path)
    validation = marker.validating(raw)
    validation.__enter__()
    marker.close()  # the process is gone: nothing blanks the slot any more
    del validation  # (its finally runs now, on a closed marker: no write)


def test_only_submits_with_format_or_tools_are_fingerprinted() -> None:
    assert fingerprint(submit()) is not None
    assert fingerprint(submit(format=None, tools=[{"type": "function"}])) is not None
    assert fingerprint(submit(format=None)) is None
    assert fingerprint({"v": 1, "type": "status", "id": "s"}) is None
    assert fingerprint({"v": 1, "type": "submit", "id": "x", "job": "not a map"}) is None
    assert fingerprint(["not", "a", "map"]) is None


def test_a_fingerprint_ignores_the_job_id_the_deadline_and_key_order() -> None:
    base = fingerprint(submit("a", deadline=1.0))
    assert fingerprint(submit("b", deadline=2.0)) == base
    reordered = submit("c")
    reordered["job"] = dict(reversed(list(reordered["job"].items())))
    assert fingerprint(reordered) == base
    assert fingerprint(submit("a", prompt="hi!")) != base
    assert fingerprint(submit("a", format={"type": "json_schema", "schema": {}})) != base


def test_a_validation_that_returns_leaves_no_death(tmp_path: Path) -> None:
    path = tmp_path / "crash-marker"
    marker = CrashMarker(path)
    with marker.validating(submit()):
        pass
    with pytest.raises(ProtocolError), marker.validating(submit()):  # returns by raising
        raise ProtocolError(ErrorCode.INVALID_FIELD, "bad")
    marker.close()
    again = CrashMarker(path)
    assert again.died_in is None and again.deaths(str(fingerprint(submit()))) == 0
    again.close()


def test_a_request_that_killed_the_scheduler_twice_is_refused_poisoned(
        tmp_path: Path) -> None:
    path = tmp_path / "crash-marker"
    fp = str(fingerprint(submit()))
    die_validating(path, submit("j1"))
    marker = CrashMarker(path)
    assert marker.died_in == (fp, "j1") and marker.deaths(fp) == 1
    with marker.validating(submit("j1")):  # one death: validated again
        marker.close()  # ... and the scheduler dies again
    marker = CrashMarker(path)
    assert marker.deaths(fp) == 2
    with pytest.raises(ProtocolError) as err, marker.validating(submit("other-id")):
        pytest.fail("a poisoned request was validated")
    assert err.value.code is ErrorCode.POISONED and err.value.retryable is False
    assert err.value.job_id == "other-id" and "died 2 times" in err.value.message
    with marker.validating(submit("j1", prompt="something else")):
        pass  # another request is validated as ever
    marker.close()


def test_the_mark_survives_a_sigkill_without_a_flush(tmp_path: Path) -> None:
    path = tmp_path / "crash-marker"
    child = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from uniun.actors.scheduler.crash_marker import CrashMarker
        marker = CrashMarker(Path({str(path)!r}))
        with marker.validating({submit("killed")!r}):
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    marker = CrashMarker(path)
    assert marker.died_in == (fingerprint(submit()), "killed")
    marker.close()


def test_the_table_keeps_the_most_recent_deaths_and_the_file_is_private(
        tmp_path: Path) -> None:
    path = tmp_path / "crash-marker"
    requests = [submit(prompt=f"p{i}") for i in range(5)]
    for raw in requests:
        die_validating(path, raw)
    marker = CrashMarker(path, max_entries=3)
    kept = [marker.deaths(str(fingerprint(raw))) for raw in requests]
    assert kept == [0, 0, 1, 1, 1]
    marker.close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    data = path.read_bytes()
    assert data.startswith(HEADER) and data[len(HEADER) + SLOT_BYTES - 1:][:1] == b"\n"
    assert len(data.splitlines()) == 2 + 3


def test_a_job_id_is_written_safe_and_short(tmp_path: Path) -> None:
    path = tmp_path / "crash-marker"
    die_validating(path, submit("a b\n" + "x" * 200))
    marker = CrashMarker(path)
    assert marker.died_in is not None and marker.died_in[1] == ("a?b?" + "x" * 200)[:64]
    marker.close()


@pytest.mark.parametrize("content", [b"", b"garbage\n", b"\xff" * 100, b"x" * 70_000,
                                     HEADER + b"inflight zz j\nnot an entry\n"])
def test_a_file_that_is_not_a_marker_starts_afresh(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "crash-marker"
    path.write_bytes(content)
    marker = CrashMarker(path)
    assert marker.died_in is None
    with marker.validating(submit()):
        pass
    marker.close()
    assert path.read_bytes().startswith(HEADER)


def test_an_unusable_file_means_serving_without_the_marker(tmp_path: Path) -> None:
    assert CrashMarker.open(tmp_path / "missing-dir" / "crash-marker") is None
