"""The scheduler<->runner records: every one survives the wire, junk is refused."""

from __future__ import annotations

import msgpack
import pytest

from uniun.protocol import runner_records as rp

SAMPLES: list[rp.Record] = [
    rp.Load(model_id="tiny-1"),
    rp.Start(job_id="j", model_id="tiny-1", job_kind="extract", prompt=None,
             messages=[["user", "hi"]], max_new_tokens=5, sampling={"temperature": 0.0},
             tokens=[3, 4], text="ab", seed=7, grant=2),
    rp.Resume(job_id="j", generated=2, grant=0),
    rp.Pause(job_id="j"), rp.Cancel(job_id="j"), rp.Drop(job_id="j"),
    rp.Heartbeat(boot="b", ack="a", seq=4, snapshots=1, snapshot_bytes=10),
    rp.Hello(boot="b", pid=1, model_id=None, jobs={"j": 2}),
    rp.ModelLoaded(model_id="m", seconds=0.5), rp.LoadFailed(model_id="m", message="no"),
    rp.Started(job_id="j", resumed=True, prompt_tokens=3, recomputed=1, seed=7),
    rp.Token(job_id="j", seq=0, token_id=9, text="é", seconds=0.01),
    rp.Paused(job_id="j", generated=3, seconds=0.2, grant_spent=True),
    rp.Finished(job_id="j", finish_reason="stop", prompt_tokens=3, generated=4, seconds=0.1),
    rp.Cancelled(job_id="j", seconds=0.0), rp.Unknown(job_id="j"),
    rp.Failed(job_id="j", message="bad", seconds=0.0),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: r.kind)
def test_every_record_round_trips(record: rp.Record) -> None:
    assert rp.decode(rp.encode(record)) == record


def test_commands_and_reports_are_told_apart() -> None:
    assert isinstance(rp.decode(rp.encode(rp.Pause(job_id="x"))), rp.Command)
    assert isinstance(rp.decode(rp.encode(rp.Unknown(job_id="x"))), rp.Report)


@pytest.mark.parametrize("frame", [
    b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"t": "launch"}),
    msgpack.packb({"t": "pause"}), msgpack.packb({"t": "pause", "job_id": "j", "extra": 1}),
])
def test_junk_is_a_bad_record(frame: bytes) -> None:
    with pytest.raises(rp.BadRecord):
        rp.decode(frame)


def test_runner_identity_is_unique_per_boot() -> None:
    assert rp.runner_identity(rp.new_boot()) != rp.runner_identity(rp.new_boot())
