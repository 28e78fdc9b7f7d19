"""The device-state signal: its record, the scheduler's publisher, and a listener that
always ends up knowing the current state."""

from __future__ import annotations

import msgpack
import zmq

from tests.wait import wait_for
from uniun.actors.scheduler.device_signal import DevicePublisher
from uniun.protocol.device_state import DeviceState, YieldGate, decode_state, encode_state


def test_the_record_round_trips_and_garbage_is_ignored() -> None:
    assert decode_state(encode_state(DeviceState(True, 7))) == DeviceState(True, 7)
    for bad in (b"", b"\xc1", msgpack.packb([1]), msgpack.packb({"v": 2, "interactive": True,
                                                                 "seq": 1}),
                msgpack.packb({"v": 1, "interactive": "yes", "seq": 1}),
                msgpack.packb({"v": 1, "interactive": True, "seq": True})):
        assert decode_state(bad) is None


def test_a_late_listener_gets_the_current_state_and_follows_changes(tmp_path) -> None:
    ctx = zmq.Context()
    pub = DevicePublisher(f"ipc://{tmp_path / 'device.sock'}", ctx, republish_s=0.1)
    pub.start()
    try:
        pub.set(True)  # published before anyone listens
        gate = YieldGate(pub.endpoint, ctx=ctx)
        try:
            assert gate.wait_heard(30.0)
            wait_for("the late listener hears 'interactive'", lambda: gate.interactive)
            seq = gate.last_seq
            pub.set(False)
            wait_for("the listener hears the change", lambda: not gate.interactive)
            assert gate.last_seq == seq + 1
            gate.wait_turn()  # returns at once while nothing interactive runs
        finally:
            gate.close()
    finally:
        pub.close()
        ctx.term()


def test_a_silent_publisher_does_not_hold_the_gate_closed(tmp_path) -> None:
    ctx = zmq.Context()
    pub = DevicePublisher(f"ipc://{tmp_path / 'device.sock'}", ctx, republish_s=0.1)
    pub.start()
    gate = YieldGate(pub.endpoint, ctx=ctx, stale_s=0.5)
    try:
        pub.set(True)
        wait_for("'interactive' heard", lambda: gate.interactive)
        pub.close()  # the scheduler is gone
        wait_for("the stale state expires", lambda: not gate.interactive)
    finally:
        gate.close()
        ctx.term()
