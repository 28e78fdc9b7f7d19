"""The scheduler core's timeline and metric observations, read from its Effects.

The core records (``actors/scheduler/recorder.py``) without any I/O: segment and mark
journal writes, and ``observe`` values. A :class:`Driver` with ``observe=True`` runs the
preemption scenario of the issue and the tests read what the host would journal and
count; the end-to-end version (real processes, a Prometheus scrape, ``trace export``) is
``tests/integration/test_observe_wire.py``.
"""

from __future__ import annotations

from collections import Counter

from tests.actors.scheduler.driver import Driver, assert_persisted_before_told
from uniun.actors.metrics import MetricSink
from uniun.actors.observe import Count, Level, Sample
from uniun.actors.scheduler.effects import Effects
from uniun.actors.timeline import Mark, Segment
from uniun.protocol import requests as rq

A, B = b"client-a", b"client-b"


def segments(d: Driver, lane: str | None = None) -> list[Segment]:
    return [w for fx in d.history for w in fx.journal
            if isinstance(w, Segment) and (lane is None or w.lane == lane)]


def marks(d: Driver) -> list[Mark]:
    return [w for fx in d.history for w in fx.journal if isinstance(w, Mark)]


def observations(d: Driver) -> list:
    return [o for fx in d.history for o in fx.observations]


def _sums(d: Driver, name: str) -> dict:
    out: dict = {}
    for o in observations(d):
        if isinstance(o, Count) and o.name == name:
            out[o.labels] = out.get(o.labels, 0) + o.n
    return out


def preempted_by_chat(observe: bool = True) -> Driver:
    """A nataraj job 5 tokens in, a chat arrives, runs to its end, the job resumes."""
    d = Driver(observe=observe)
    d.up()
    d.submit(A, "bg", "nataraj", max_new_tokens=12)
    d.deliver()
    d.step(5)
    d.submit(B, "talk", "chat", max_new_tokens=3)
    d.run()
    return d


def test_a_preempted_job_has_a_segment_ending_preempted_then_the_chat_then_its_resume() -> None:
    d = preempted_by_chat()
    runs = [(s.job_id, s.reason, s.tokens, s.tier) for s in segments(d, "run")]
    assert runs == [("bg", "preempted", 5, 4), ("talk", "done", 3, 0), ("bg", "done", 7, 4)]
    ran = segments(d, "run")
    assert ran[0].end <= ran[1].start <= ran[1].end <= ran[2].start  # one runner
    waits = [(s.job_id, s.reason, s.tier) for s in segments(d, "wait")]
    assert waits == [("bg", "dispatched", 4), ("talk", "dispatched", 0), ("bg", "dispatched", 4)]
    # the second wait of bg is its pause: from the end of its first run to its resume
    assert segments(d, "wait")[2].start == ran[0].end and segments(d, "wait")[2].end == ran[2].start
    what = [(mk.what, mk.job_id) for mk in marks(d)]
    assert ("preempt", "bg") in what and ("resume", "bg") in what
    assert [mk.detail for mk in marks(d) if mk.what == "preempt"] == ["preempted for talk"]
    assert_persisted_before_told(d.history)


def test_metric_observations_follow_the_events() -> None:
    d = preempted_by_chat()
    assert _sums(d, "jobs_accepted") == {(("kind", "nataraj"), ("tier", "T4")): 1,
                                        (("kind", "chat"), ("tier", "T0")): 1}
    assert _sums(d, "jobs_done") == {(("kind", "nataraj"), ("tier", "T4")): 1,
                                    (("kind", "chat"), ("tier", "T0")): 1}
    assert _sums(d, "preemptions") == {(("reason", "preempted"),): 1}
    assert _sums(d, "tokens_generated") == {(("kind", "nataraj"),): 12, (("kind", "chat"),): 3}
    samples = [o for o in observations(d) if isinstance(o, Sample)]
    assert [o.name for o in samples if o.name == "chat_ttft_seconds"] == ["chat_ttft_seconds"]
    pauses = [o for o in samples if o.name == "pause_seconds"]
    assert [o.labels for o in pauses] == [(("kind", "nataraj"), ("reason", "preempted"))]
    assert pauses[0].value > 0
    steps = Counter(dict(o.labels)["phase"] for o in samples if o.name == "runner_step_seconds")
    assert steps == {"first": 3, "decode": 12}  # one first token per segment
    waits = [dict(o.labels)["kind"] for o in samples if o.name == "queue_wait_seconds"]
    assert waits == ["nataraj", "chat"]  # acceptance -> first dispatch, once per job
    depth = [o for o in observations(d) if isinstance(o, Level) and o.name == "queue_depth"]
    assert {dict(o.labels)["tier"] for o in depth} == {"T0", "T1", "T2", "T3", "T4"}


def test_a_sink_moves_the_prometheus_metric_when_its_event_happens() -> None:
    d = preempted_by_chat()
    sink = MetricSink()  # a private registry: no other test's values
    value = sink.registry.get_sample_value
    assert value("uniun_preemptions_total", {"reason": "preempted"}) is None
    sink.apply(observations(d))
    assert value("uniun_preemptions_total", {"reason": "preempted"}) == 1
    assert value("uniun_tokens_generated_total", {"kind": "chat"}) == 3
    assert value("uniun_jobs_done_total", {"kind": "chat", "tier": "T0"}) == 1
    assert value("uniun_chat_ttft_seconds_count") == 1
    d.submit(A, "again", "chat", max_new_tokens=2)
    before = len(d.history)
    d.run()
    sink.apply([o for fx in d.history[before - 2:] for o in fx.observations])
    assert value("uniun_chat_ttft_seconds_count") == 2
    assert value("uniun_tokens_generated_total", {"kind": "chat"}) == 5
    sink.apply([Count("no_such_metric")])  # a bug in a caller is logged, not raised


def test_recording_off_writes_no_timeline_and_observes_nothing() -> None:
    d = preempted_by_chat(observe=False)
    assert segments(d) == [] and marks(d) == [] and observations(d) == []
    assert d.core.rec.recent  # top's recent events are kept regardless


def test_a_job_cancelled_while_waiting_ends_its_wait_and_counts_as_failed() -> None:
    d = Driver(observe=True)
    d.up()
    d.submit(A, "bg", "nataraj", max_new_tokens=50)
    d.deliver()
    d.submit(A, "later", "gana", max_new_tokens=5)
    d.cancel(A, "later")
    [wait] = [s for s in segments(d, "wait") if s.job_id == "later"]
    assert wait.reason == "cancelled" and wait.tier == 4
    assert _sums(d, "jobs_failed") == {(("kind", "gana"), ("tier", "T4"), ("code", "cancelled")): 1}


def test_a_lost_runner_ends_the_run_segment_and_marks_it() -> None:
    d = Driver(observe=True)
    d.up()
    d.submit(A, "bg", "nataraj", max_new_tokens=20)
    d.deliver()
    d.step(4)
    d.down("killed")
    [run] = segments(d, "run")
    assert (run.job_id, run.reason, run.tokens) == ("bg", "runner_lost", 4)
    assert [(mk.what, mk.job_id, mk.detail) for mk in marks(d)][-1] == (
        "runner_lost", "bg", "killed")
    d.up()
    d.run()
    runs = [(s.job_id, s.reason, s.tokens) for s in segments(d, "run")]
    assert runs == [("bg", "runner_lost", 4), ("bg", "done", 16)]
    assert "runner_up" in [mk.what for mk in marks(d)]
    # a fail-over is not a pause: no pause_seconds sample for it
    assert not [o for o in observations(d) if o.name == "pause_seconds"]


def test_status_carries_recent_events_parking_and_the_t2_budget() -> None:
    d = preempted_by_chat()
    d.core.runner_stats(2, 4096, trimmed=1, spilled=3)
    fx: Effects = d.request(A, rq.StatusRequest("st"))
    body = next(s.msg for s in fx.sends if s.msg.get("type") == "status")
    assert [e["what"] for e in body["events"]][-2:] == ["preempt", "resume"]
    assert body["parking"] == {"trimmed": 1, "spilled": 3}
    assert body["t2_share_max"] == 0.6 and "process_info" in body


def test_the_depth_gauge_waits_out_its_throttle_with_a_wake() -> None:
    d = Driver(observe=True)
    d.up()
    d.submit(A, "one", "nataraj", max_new_tokens=50)
    d.submit(A, "two", "nataraj", max_new_tokens=50)  # within the throttle: deferred
    last = [o for fx in d.history for o in fx.observations if o.name == "queue_depth"]
    assert d.wake_at is not None  # the core asked to be woken for the deferred refresh
    d.wake()
    after = [o for fx in d.history for o in fx.observations if o.name == "queue_depth"]
    assert len(after) > len(last)
    t4 = [o.value for o in after if dict(o.labels)["tier"] == "T4"]
    assert t4 == [0, 1]  # first "one" (dispatched at once), after the wake "two" waiting


def test_a_swap_is_marked_and_counted_by_the_model_loaded() -> None:
    d = Driver(observe=True)
    d.up()
    d.submit(A, "other", "chat", model_id="m-other", max_new_tokens=2)
    d.run()
    assert _sums(d, "swaps") == {(("model", "m-other"),): 1}
    assert [(mk.what, mk.detail) for mk in marks(d) if mk.what == "swap"] == [
        ("swap", "load m-other")]
    [run] = segments(d, "run")
    assert run.model_id == "m-other" and run.reason == "done"
