"""The front's pending requests (pure): control before bulk, connections in turn, capped,
and never reordered across one job's requests."""

from __future__ import annotations

from uniun.actors.scheduler.inbox_order import FairInbox, Interactive, Pending, classify

RULES = Interactive(chat_kind="chat", foreground=None, extract_kind="extract")
A, B, C = b"client-a", b"client-b", b"client-c"


def submit(conn: bytes, job_id: str, kind: str = "nataraj", **job: object) -> Pending:
    return classify(conn, {"v": 1, "type": "submit", "id": f"s-{job_id}",
                           "job": {"job_id": job_id, "kind": kind, "prompt": "x", **job}},
                    RULES)


def cancel(conn: bytes, job_id: str) -> Pending:
    return classify(conn, {"v": 1, "type": "cancel", "id": f"c-{job_id}", "job_id": job_id},
                    RULES)


def status(conn: bytes, n: int) -> Pending:
    return classify(conn, {"v": 1, "type": "status", "id": f"st-{n}"}, RULES)


def inbox_of(items: list[Pending], per_conn: int = 100_000) -> FairInbox:
    inbox = FairInbox(per_conn)
    for item in items:
        assert inbox.push(item)
    return inbox


def ids(items: list[Pending]) -> list[str]:
    return [item.raw["id"] for item in items]


def test_a_chat_behind_a_thousand_submits_goes_first() -> None:
    inbox = inbox_of([submit(A, f"bg-{i}") for i in range(1000)] + [submit(B, "chat-1", "chat")])
    batch = inbox.take_batch(64, 128)
    assert ids(batch)[0] == "s-chat-1"
    assert ids(batch)[1:] == [f"s-bg-{i}" for i in range(128)]
    assert len(inbox) == 1000 - 128
    assert ids(inbox.take_batch(64, 10_000)) == [f"s-bg-{i}" for i in range(128, 1000)]


def test_status_and_cancel_of_an_accepted_job_go_before_bulk() -> None:
    inbox = inbox_of([submit(A, "bg-0"), submit(A, "bg-1"), status(B, 0), cancel(B, "old")])
    assert ids(inbox.take_batch(64, 1)) == ["st-0", "c-old", "s-bg-0"]
    assert ids(inbox.take_batch(64, 1)) == ["s-bg-1"] and len(inbox) == 0


def test_connections_take_turns_so_a_flood_gets_one_request_per_round() -> None:
    # A floods status; B and C each send one request behind the whole flood.
    inbox = inbox_of([status(A, i) for i in range(5000)] + [status(B, 0), status(C, 0)])
    batch = inbox.take_batch(4, 128)
    assert [p.conn for p in batch] == [A, B, C, A]
    # The turn order carries over: A alone is left, so A fills the next batch.
    assert [p.conn for p in inbox.take_batch(4, 128)] == [A] * 4


def test_bulk_lanes_take_turns_too() -> None:
    inbox = inbox_of([submit(A, f"a-{i}") for i in range(10)] + [submit(B, "b-0"),
                                                                  submit(B, "b-1")])
    assert ids(inbox.take_batch(64, 5)) == ["s-a-0", "s-b-0", "s-a-1", "s-b-1", "s-a-2"]


def test_a_connection_at_its_cap_is_refused_and_others_are_not() -> None:
    inbox = FairInbox(per_conn=3)
    assert [inbox.push(status(A, i)) for i in range(5)] == [True, True, True, False, False]
    assert inbox.push(status(B, 0))
    assert len(inbox) == 4 and inbox.pending_of(A) == 3
    inbox.take_batch(2, 0)  # one of A's is taken: A may queue one more
    assert inbox.push(status(A, 9)) and not inbox.push(status(A, 10))


def test_a_cancel_never_overtakes_the_submit_it_cancels() -> None:
    # Its submit is taken in this batch: the cancel comes right after it, not first.
    items = [submit(A, "bg-0"), submit(A, "bg-1"), cancel(A, "bg-1")]
    assert ids(inbox_of(items).take_batch(64, 10)) == ["s-bg-0", "s-bg-1", "c-bg-1"]
    # Its submit stays pending (bulk is full): so does the cancel, behind it.
    inbox = inbox_of(items)
    assert ids(inbox.take_batch(64, 1)) == ["s-bg-0"]
    assert inbox.controls == 1  # the waiting cancel still counts as control
    assert ids(inbox.take_batch(64, 1)) == ["s-bg-1", "c-bg-1"] and len(inbox) == 0
    assert inbox.controls == 0


def test_the_same_job_id_from_another_client_is_another_key() -> None:
    inbox = inbox_of([submit(A, "bg-0"), submit(A, "job"), cancel(B, "job")])
    assert ids(inbox.take_batch(64, 1)) == ["c-job", "s-bg-0"]  # B's cancel: B's view
    assert ids(inbox.take_batch(64, 1)) == ["s-job"]


def test_a_resent_submit_stays_behind_the_first() -> None:
    first, again = submit(A, "bg-0"), submit(A, "bg-0")
    again.raw["id"] = "s-bg-0-again"
    inbox = inbox_of([first, submit(A, "bg-1"), again, submit(B, "chat-1", "chat")])
    assert ids(inbox.take_batch(64, 2)) == ["s-chat-1", "s-bg-0", "s-bg-1"]
    assert ids(inbox.take_batch(64, 2)) == ["s-bg-0-again"]


def test_a_gone_client_loses_its_status_requests_but_not_its_submits_or_cancels() -> None:
    inbox = inbox_of([status(A, 0), submit(A, "bg-0"), status(A, 1), cancel(A, "bg-0"),
                      status(B, 0)])
    assert inbox.drop_reply_only(A) == 2
    assert inbox.drop_reply_only(A) == 0
    assert ids(inbox.take_batch(64, 64)) == ["st-0", "s-bg-0", "c-bg-0"]
    assert len(inbox) == 0 and inbox.controls == 0


def test_interactive_submits_are_control_the_rest_bulk() -> None:
    rules = Interactive(chat_kind="chat", foreground="nataraj", extract_kind="extract")
    assert classify(A, {"type": "submit", "job": {"job_id": "j", "kind": "chat"}}, RULES).control
    assert classify(A, {"type": "submit", "job": {"job_id": "j", "kind": "nataraj"}},
                    rules).control
    assert not classify(A, {"type": "submit", "job": {"job_id": "j", "kind": "gana"}},
                        rules).control
    fg_extract = Interactive("chat", "extract", "extract")
    assert not classify(A, {"type": "submit", "job": {"job_id": "j", "kind": "extract"}},
                        fg_extract).control
    assert classify(A, {"type": "submit", "job": {"job_id": "j", "kind": "extract",
                                                  "foreground_hint": True}},
                    fg_extract).control


def test_malformed_messages_are_control_so_their_error_comes_early() -> None:
    for raw in ([1, 2], {"type": "submit", "job": "nope"}, {"type": "bogus"}):
        item = classify(A, raw, RULES)
        assert item.control


def test_a_request_whose_type_is_a_map_or_a_list_is_not_reply_only() -> None:
    """A hostile frame's ``type`` may be unhashable; asking about it must not raise (the
    front would die with the question)."""
    for kind in ({}, [], {"a": 1}, ["status"], None, 3):
        assert not Pending(b"c", {"type": kind}, True, None).reply_only
    assert Pending(b"c", {"type": "status"}, True, None).reply_only
