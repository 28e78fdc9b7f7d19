"""The producer actor: ticks its logic in the actor's thread, reports failures."""

from __future__ import annotations

import threading
import time

from uniun.actors.producers.actor import ProducerActor


class FakeLogic:
    name = "fake"

    def __init__(self, fail_at: int | None = None) -> None:
        self.steps = 0
        self.fail_at = fail_at
        self.closed = False
        self.threads: set[str] = set()
        self.tracker = None

    def step(self, now: float) -> None:
        self.threads.add(threading.current_thread().name)
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("boom")

    def close(self) -> None:
        time.sleep(0.05)  # a real close takes a while: a watcher must not outrun it
        self.closed = True


def _wait(check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_actor_ticks_in_its_own_thread_and_closes_on_stop() -> None:
    logic = FakeLogic()
    made_in: list[str] = []

    def make() -> FakeLogic:
        made_in.append(threading.current_thread().name)
        return logic

    failed = threading.Event()
    ref = ProducerActor.start(make, pump_s=0.0, failed=failed)
    _wait(lambda: logic.steps >= 5)
    ref.stop(timeout=10)
    assert logic.closed and not failed.is_set()
    assert logic.threads == set(made_in) and made_in[0] != threading.current_thread().name


def test_a_failing_tick_stops_the_actor_and_is_reported() -> None:
    logic = FakeLogic(fail_at=3)
    failed = threading.Event()
    ref = ProducerActor.start(lambda: logic, pump_s=0.0, failed=failed)
    _wait(failed.is_set)
    _wait(lambda: not ref.is_alive())
    assert logic.closed and logic.steps == 3


def test_a_failing_start_is_reported_too() -> None:
    def make() -> FakeLogic:
        raise OSError("cannot open the results database")

    failed = threading.Event()
    ref = ProducerActor.start(make, pump_s=0.0, failed=failed)
    _wait(lambda: not ref.is_alive())
    assert failed.is_set()


def test_the_process_entry_exits_1_when_a_tick_fails(monkeypatch) -> None:
    # pykka marks the actor dead before on_failure has closed the logic and set
    # ``failed``; a close slower than the entry's 0.2 s poll makes that window certain.
    from uniun.runtime import process
    from uniun.runtime.producers_main import run_producer

    class SlowClosingLogic(FakeLogic):
        def close(self) -> None:
            time.sleep(0.5)
            super().close()

    monkeypatch.setattr(process, "_stop_callbacks", [])
    logic = SlowClosingLogic(fail_at=2)
    assert run_producer(lambda: logic, pump_s=0.0) == 1
    assert logic.closed
