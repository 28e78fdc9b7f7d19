"""The scheduler's per-client bounds: the queue's chat reserve, a client's share of the
background room, and the log-probabilities ended jobs keep (``admission.py``,
``kept_logprobs.py``), through the core as its host feeds it."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

from tests.actors.policy.harness import FakeClock
from tests.actors.scheduler.driver import Driver, entry, msgs, spec
from uniun.actors.policy import make_policy
from uniun.actors.scheduler.admission import QueueBounds
from uniun.actors.scheduler.core import SchedulerCore
from uniun.actors.scheduler.kept_logprobs import ENDED_TOTAL_BYTES, EndedLogprobs, pack
from uniun.protocol import requests as rq, runner_records as rp

A, B, C = b"client-a", b"client-b", b"client-c"


def reply(d: Driver, conn: bytes, job: str, kind: str = "nataraj", **fields: Any) -> dict:
    """The reply to one submit of ``conn``."""
    return msgs(d.submit(conn, job, kind, **fields), conn)[0]


# ---- the chat reserve -------------------------------------------------------------------


def test_background_work_fills_only_its_room_and_a_chat_is_still_accepted() -> None:
    d = Driver(queue_cap=10, chat_reserve_share=0.2, client_share=1.0)  # room for 8
    for i in range(8):
        assert reply(d, A if i % 2 else B, f"bg-{i}")["type"] == "accepted"
    full = reply(d, C, "bg-8")
    assert full["code"] == "queue_full" and full["retryable"] is True
    assert "chat reserve of 2" in full["message"] and "chat_reserve_share" in full["message"]
    assert d.core.policy.status()["queues"]["T4"] == [f"bg-{i}" for i in range(8)]

    assert reply(d, C, "talk-1", "chat")["type"] == "accepted"
    assert reply(d, A, "talk-2", "chat")["type"] == "accepted"
    capped = reply(d, C, "talk-3", "chat")  # two chats took the reserve; the cap is reached
    assert capped["code"] == "queue_full" and "limits.queue_cap is 10" in capped["message"]

    d.cancel(A, "bg-1")  # a background job ended: its room is free for background work again
    assert reply(d, C, "bg-9")["type"] == "accepted"


def test_the_default_bounds_keep_a_tenth_for_chats_and_half_the_rest_per_client() -> None:
    bounds = QueueBounds(10_000)
    assert (bounds.chat_reserve, bounds.background_room, bounds.client_room) == \
        (1000, 9000, 4500)
    tiny = QueueBounds(2)  # rounding never takes the reserve or a client's last job away
    assert (tiny.chat_reserve, tiny.background_room, tiny.client_room) == (1, 1, 1)


# ---- a client's share -------------------------------------------------------------------


def test_a_client_over_its_share_is_refused_naming_the_bound_and_other_clients_are_not() -> None:
    d = Driver(queue_cap=10, chat_reserve_share=0.2, client_share=0.5)  # 4 each of 8
    for i in range(4):
        assert reply(d, A, f"a-{i}")["type"] == "accepted"
    over = reply(d, A, "a-4")
    assert over["code"] == "queue_full" and over["job_id"] == "a-4"
    assert "this client has 4 background jobs open" in over["message"]
    assert "limits.client_share" in over["message"]
    assert msgs(d.attach(A, "a-4"), A)[0]["code"] == "not_found"  # refused: changed nothing

    assert reply(d, B, "b-0")["type"] == "accepted"
    assert reply(d, A, "talk", "chat")["type"] == "accepted"  # chats do not count
    assert reply(d, A, "a-0")["type"] == "accepted"  # a re-sent submit is not a new job

    d.cancel(A, "a-2")
    assert reply(d, A, "a-5")["type"] == "accepted"  # one ended: room for one more


def test_every_connection_of_one_key_counts_against_that_key() -> None:
    d = Driver(queue_cap=10, chat_reserve_share=0.2, client_share=0.25)  # 2 each
    assert reply(d, A, "k-0", owner="key-1")["type"] == "accepted"
    assert reply(d, B, "k-1", owner="key-1")["type"] == "accepted"
    assert reply(d, C, "k-2", owner="key-1")["code"] == "queue_full"
    assert reply(d, C, "other", owner="key-2")["type"] == "accepted"


def test_replayed_jobs_fill_the_background_room_but_no_client_share() -> None:
    entries = [entry(f"old-{i}", "nataraj", 0) for i in range(3)]
    for e in entries:
        e.started = False
    d = Driver(queue_cap=5, chat_reserve_share=0.2, client_share=0.25, entries=entries)
    assert reply(d, A, "new-0")["type"] == "accepted"  # 4 background: the room is full
    assert "chat reserve" in reply(d, B, "new-1")["message"]


# ---- log-probabilities of ended jobs ----------------------------------------------------


def compact(seq: int, k: int = 20) -> list[Any]:
    """A runner's compact log-probability record for token ``seq``."""
    return [f"w{seq}", f"w{seq}".encode(), -0.25,
            [[f"a{i}", f"a{i}".encode(), -1.0 - i / 8] for i in range(k)]]


def run_with_logprobs(d: Driver, job: str, tokens: int, k: int = 20) -> None:
    """Client A submits ``job`` with ``logprobs: k``; the runner streams ``tokens`` tokens
    with their records and finishes it (reports fed as the runner link feeds them)."""
    d.submit(A, job, "extract", logprobs=k, max_new_tokens=tokens)
    d.report(rp.Started(job_id=job, resumed=False, prompt_tokens=3, recomputed=0, seed=1))
    for seq in range(tokens):
        d.report(rp.Token(job_id=job, seq=seq, token_id=1000 + seq, text=f"w{seq} ",
                          logprobs=compact(seq, k)))
    d.report(rp.Finished(job_id=job, finish_reason="length", prompt_tokens=3,
                         generated=tokens, seconds=0.1))


def packed_size(tokens: int) -> int:
    """What one job of ``run_with_logprobs`` keeps, packed."""
    return sum(len(pack(compact(seq))) for seq in range(tokens))


def attached(d: Driver, job: str) -> tuple[dict, list[dict], dict]:
    """What a new connection's ``attach`` of an ended job gets: reply, tokens, end."""
    first, *tokens, end = msgs(d.attach(C, job, after_seq=-1), C)
    return first, tokens, end


def test_ended_jobs_keep_log_probabilities_within_the_bound_and_attach_says_when_dropped() -> None:
    d = Driver()
    d.up()
    d.core.jobs.ended_logprobs = kept = EndedLogprobs(job_bytes=64 * 1024,
                                                      total_bytes=2 * packed_size(8))
    for n in range(4):
        run_with_logprobs(d, f"lp-{n}", tokens=8)
        assert kept.bytes <= kept.total_bytes
    assert kept.bytes == 2 * packed_size(8)  # the two that ended last

    recent, tokens, end = attached(d, "lp-3")
    assert "logprobs_dropped" not in recent
    assert tokens == d.told(A, "lp-3", "token")  # as streamed live, log-probabilities included
    assert tokens[0]["logprobs"]["top_logprobs"][19] == {"token": "a19", "bytes": list(b"a19"),
                                                         "logprob": -1.0 - 19 / 8}

    assert "logprobs_dropped" not in attached(d, "lp-2")[0]
    oldest, tokens, end = attached(d, "lp-0")
    assert oldest["type"] == "accepted" and oldest["state"] == "ended"
    assert oldest["logprobs_dropped"] is True and oldest["streamed"] == 8
    assert [t["text"] for t in tokens] == [f"w{s} " for s in range(8)]
    assert all("logprobs" not in t for t in tokens)
    assert end["type"] == "done" and end["text"] == "".join(f"w{s} " for s in range(8))


def test_a_job_with_more_than_one_jobs_bound_keeps_none_after_it_ends() -> None:
    d = Driver()
    d.up()
    d.core.jobs.ended_logprobs = EndedLogprobs(job_bytes=packed_size(8) - 1,
                                               total_bytes=1 << 20)
    run_with_logprobs(d, "big", tokens=8)
    reply_, tokens, end = attached(d, "big")
    assert reply_["logprobs_dropped"] is True and len(tokens) == 8 and end["type"] == "done"
    assert d.core.jobs.ended_logprobs.bytes == 0


def test_a_restarted_scheduler_says_the_streamed_log_probabilities_are_gone() -> None:
    d = Driver(entries=[entry("lp", "extract", 3, logprobs=5, max_new_tokens=6)])
    first = msgs(d.attach(C, "lp", after_seq=-1), C)[0]
    assert first["type"] == "accepted" and first["logprobs_dropped"] is True


def test_what_ended_jobs_with_top_logprobs_20_retain_is_bounded() -> None:
    """Jobs of 256 tokens at ``logprobs: 20``: what the core still holds after they ended
    grows by the ended jobs' bound and their texts, not by the expanded maps (about 9 KB
    a token, 2.3 MB a job). The bound is lowered so that a few jobs pass it."""
    clock = FakeClock()
    core = SchedulerCore(policy=make_policy("uniun", None, clock, wall_clock=clock),
                         queue_cap=100, clock=clock, wall=clock, segments=False,
                         metrics=False)
    core.jobs.ended_logprobs = kept = EndedLogprobs(total_bytes=ENDED_TOTAL_BYTES // 8)
    core.runner_up(rp.Hello(boot="b", pid=1, model_id=spec("x", "chat").model_id, jobs={}))
    records = [compact(seq) for seq in range(256)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(24):  # past the bound twice over
            job = f"lp-{n}"
            core.request(A, rq.Submit(f"s{n}", spec(job, "extract", logprobs=20,
                                                    max_new_tokens=256)))
            core.pump()
            core.report(rp.Started(job_id=job, resumed=False, prompt_tokens=3, recomputed=0,
                                   seed=1))
            for seq, record in enumerate(records):
                core.report(rp.Token(job_id=job, seq=seq, token_id=1000 + seq * 37,
                                     text=f"w{seq} ", logprobs=record))
            core.report(rp.Finished(job_id=job, finish_reason="length", prompt_tokens=3,
                                    generated=256, seconds=0.1))
            core.pump()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0 < kept.bytes <= kept.total_bytes
    # per ended job beyond its log-probabilities: texts, ids, the done event, < 32 KB
    assert grown <= kept.total_bytes * 1.25 + 24 * 32 * 1024, grown
