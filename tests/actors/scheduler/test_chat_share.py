"""T0's fair shares through the scheduler core and the real runner bookkeeping (fake model).

Who a chat is served for reaches the core as the submitter's connection or CURVE key,
or the ``client`` field a producer such as the gateway names (``admission.chat_client``).
A chat paused for another client's is parked on the runner and resumed there: its stream
is the one it would have been without the pause.
"""

from __future__ import annotations

import itertools

from tests.actors.scheduler.driver import Driver, msgs, text_of
from uniun.actors.policy import PolicyConfig
from uniun.protocol import runner_records as rp

A, B, C = b"conn-a", b"conn-b", b"conn-c"
QUANTUM = 4


def driver() -> Driver:
    d = Driver(config=PolicyConfig(chat_quantum_tokens=QUANTUM))
    d.up()
    return d


def done_order(d: Driver) -> list[str]:
    return [m["job_id"] for fx in d.history for m in msgs(fx, type="done")]


def streamed(d: Driver, conn: bytes, job: str) -> str:
    return "".join(m["text"] for m in d.told(conn, job, "token"))


def test_another_connections_chat_runs_before_a_long_chat_ends_which_then_resumes_exactly() -> None:
    d = driver()
    d.submit(A, "a-0", "chat", max_new_tokens=60)
    d.run(20)  # a-0 streams a while
    d.submit(B, "b-0", "chat", max_new_tokens=QUANTUM - 1)  # ends within its turn
    d.run()
    assert done_order(d) == ["b-0", "a-0"]
    # a-0 was parked and resumed on the runner, not restarted: one Start, one Resume
    sent = [c for c in d.runner.received if getattr(c, "job_id", None) == "a-0"]
    assert [type(c) for c in sent if isinstance(c, (rp.Start, rp.Resume))] == [
        rp.Start, rp.Resume]
    assert [m["reason"] for m in d.told(A, "a-0", "paused")] == ["slice"]
    assert streamed(d, A, "a-0") == "".join(text_of(s) for s in range(60))
    done = d.told(A, "a-0", "done")[0]
    assert done["text"] == streamed(d, A, "a-0") and done["preemptions"] == 1


def test_two_connections_chatting_at_once_take_turns() -> None:
    d = driver()
    d.submit(A, "a-0", "chat", max_new_tokens=40)
    d.submit(B, "b-0", "chat", max_new_tokens=40)
    d.run()
    runs = [c.job_id for c in d.runner.received if isinstance(c, (rp.Start, rp.Resume))]
    assert len(runs) >= 40 * 2 // QUANTUM - 2
    assert all(x != y for x, y in itertools.pairwise(runs))  # alternating
    for conn, job in ((A, "a-0"), (B, "b-0")):
        assert streamed(d, conn, job) == "".join(text_of(s) for s in range(40))


def test_many_connections_naming_one_client_share_its_counter() -> None:
    d = driver()
    # The gateway submits every HTTP request of one client on whichever pooled
    # connection is free; the client field makes them one client.
    d.submit(A, "a-0", "chat", max_new_tokens=40, client="http 127.0.0.1")
    d.run(10)
    d.submit(B, "a-1", "chat", max_new_tokens=40, client="http 127.0.0.1")
    d.submit(C, "c-0", "chat", max_new_tokens=40, client="http 127.0.0.1 cookie")
    d.run()
    runs = [c.job_id for c in d.runner.received if isinstance(c, (rp.Start, rp.Resume))]
    # a-1 does not take a turn of its own: it waits behind a-0 (one client, its order)
    assert runs.index("a-1") > runs.index("c-0")
    first_a1 = runs.index("a-1")
    assert "a-0" not in runs[first_a1:]  # a-0 had ended before a-1 started
    assert done_order(d)[-1] == "a-1"


def test_connections_of_one_curve_key_are_one_client() -> None:
    d = driver()
    d.submit(A, "k-0", "chat", max_new_tokens=40, owner="key-k")
    d.run(10)
    d.submit(B, "k-1", "chat", max_new_tokens=5, owner="key-k")
    d.run()
    assert done_order(d) == ["k-0", "k-1"]  # the same client: first come, first served
    assert not [m for fx in d.history for m in msgs(fx, type="paused")]


def test_a_client_field_names_a_client_only_within_its_key() -> None:
    d = driver()
    d.submit(A, "x-0", "chat", max_new_tokens=40, owner="key-x", client="same")
    d.run(10)
    d.submit(B, "y-0", "chat", max_new_tokens=5, owner="key-y", client="same")
    d.run()
    assert done_order(d) == ["y-0", "x-0"]  # two keys: two clients, whatever they say
