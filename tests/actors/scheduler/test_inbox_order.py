"""The front's batch order (pure): control before bulk, never across one job's requests."""

from __future__ import annotations

from uniun.actors.scheduler.inbox_order import Interactive, Pending, classify, take_batch

RULES = Interactive(chat_kind="chat", foreground=None, extract_kind="extract")
A, B = b"client-a", b"client-b"


def submit(conn: bytes, job_id: str, kind: str = "nataraj", **job: object) -> Pending:
    return classify(conn, {"v": 1, "type": "submit", "id": f"s-{job_id}",
                           "job": {"job_id": job_id, "kind": kind, "prompt": "x", **job}},
                    RULES)


def cancel(conn: bytes, job_id: str) -> Pending:
    return classify(conn, {"v": 1, "type": "cancel", "id": f"c-{job_id}", "job_id": job_id},
                    RULES)


def ids(items: list[Pending]) -> list[str]:
    return [item.raw["id"] for item in items]


def test_a_chat_behind_a_thousand_submits_goes_first() -> None:
    pending = [submit(A, f"bg-{i}") for i in range(1000)] + [submit(B, "chat-1", "chat")]
    batch, rest = take_batch(pending, max_bulk=128)
    assert ids(batch)[0] == "s-chat-1"
    assert ids(batch)[1:] == [f"s-bg-{i}" for i in range(128)]
    assert ids(rest) == [f"s-bg-{i}" for i in range(128, 1000)]


def test_status_and_cancel_of_an_accepted_job_go_before_bulk() -> None:
    status = classify(B, {"v": 1, "type": "status", "id": "st"}, RULES)
    pending = [submit(A, "bg-0"), submit(A, "bg-1"), status, cancel(B, "old-job")]
    batch, rest = take_batch(pending, max_bulk=1)
    assert ids(batch) == ["st", "c-old-job", "s-bg-0"]
    assert ids(rest) == ["s-bg-1"]


def test_a_cancel_never_overtakes_the_submit_it_cancels() -> None:
    # Its submit is taken in this batch: the cancel comes right after it, not first.
    pending = [submit(A, "bg-0"), submit(A, "bg-1"), cancel(A, "bg-1")]
    batch, _ = take_batch(pending, max_bulk=10)
    assert ids(batch) == ["s-bg-0", "s-bg-1", "c-bg-1"]
    # Its submit stays pending (bulk is full): so does the cancel, behind it.
    batch, rest = take_batch(pending, max_bulk=1)
    assert ids(batch) == ["s-bg-0"]
    assert ids(rest) == ["s-bg-1", "c-bg-1"]
    batch, rest = take_batch(rest, max_bulk=1)
    assert ids(batch) == ["s-bg-1", "c-bg-1"] and rest == []


def test_the_same_job_id_from_another_client_is_another_key() -> None:
    pending = [submit(A, "bg-0"), submit(A, "job"), cancel(B, "job")]
    batch, rest = take_batch(pending, max_bulk=1)
    assert ids(batch) == ["c-job", "s-bg-0"]  # B's cancel is about B's view of "job"
    assert ids(rest) == ["s-job"]


def test_a_resent_submit_stays_behind_the_first() -> None:
    first, again = submit(A, "bg-0"), submit(A, "bg-0")
    again.raw["id"] = "s-bg-0-again"
    chat = submit(B, "chat-1", "chat")
    batch, rest = take_batch([first, submit(A, "bg-1"), again, chat], max_bulk=2)
    assert ids(batch) == ["s-chat-1", "s-bg-0", "s-bg-1"]
    assert ids(rest) == ["s-bg-0-again"]


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
