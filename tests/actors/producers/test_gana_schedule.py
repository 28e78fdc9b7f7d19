"""Gana fire times and exactly-once claims, with plain numbers for time."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.actors.producers.fakes import stable_id
from uniun.actors.producers.gana_schedule import (
    GanaConfigError,
    GanaDef,
    due_slot,
    fire_job_id,
    gana_job,
    load_ganas,
    next_slot,
    parse_ganas,
)
from uniun.actors.producers.results import ResultsStore
from uniun.actors.producers.results_fires import (
    OWNER_BACKGROUND,
    OWNER_CRON,
    adopt_expired,
    claim_fire,
    finish_fire,
    fires,
    open_fires,
)

E = 600.0  # every 10 minutes


def test_a_gana_that_never_fired_fires_at_once() -> None:
    assert due_slot(None, E, now=1000.0) == 1000.0
    assert due_slot(None, E, now=1000.0, lead_s=60) == 1060.0  # submitted now, due in 60 s


def test_next_fire_is_one_interval_after_the_last() -> None:
    assert due_slot(1000.0, E, now=1000.0 + E - 1) is None
    assert due_slot(1000.0, E, now=1000.0 + E) == 1000.0 + E
    assert next_slot(1000.0, E, now=1001.0) == 1000.0 + E


def test_fires_missed_while_down_fire_once_at_the_latest_slot() -> None:
    last = 1000.0
    now = last + 5.5 * E  # down for five and a half intervals
    slot = due_slot(last, E, now)
    assert slot == last + 5 * E  # one fire, not five
    assert due_slot(slot, E, now) is None  # and nothing else is due after it
    assert due_slot(slot, E, now=last + 6 * E) == last + 6 * E  # the grid continues


def test_lead_makes_a_slot_due_early() -> None:
    assert due_slot(1000.0, E, now=1000.0 + E - 30, lead_s=60) == 1000.0 + E
    assert due_slot(1000.0, E, now=1000.0 + E - 90, lead_s=60) is None


def test_walking_time_forward_fires_each_slot_exactly_once() -> None:
    last, fired = None, []
    for t in range(0, 36_000, 7):  # ten hours in 7 s steps
        slot = due_slot(last, E, float(t))
        if slot is not None:
            fired.append(slot)
            last = slot
    assert fired == [i * E for i in range(60)]


def test_the_job_map_carries_deadline_and_flow() -> None:
    g = GanaDef("digest", "Summarise", 1.0, model_id="tiny-2", max_new_tokens=500)
    job = gana_job(g, job_id=fire_job_id("digest", 120.0), deadline=120.0,
                   max_new_tokens_cap=64)
    assert stable_id(job["job_id"]) == "gana-digest-120000"
    assert (job["kind"], job["flow"], job["deadline"], job["model_id"]) == \
        ("gana", "digest", 120.0, "tiny-2")
    assert job["max_new_tokens"] == 64
    assert job["messages"][-1] == {"role": "user", "content": "Summarise"}


def test_ganas_toml_is_read_and_bad_entries_are_named(tmp_path: Path) -> None:
    path = tmp_path / "ganas.toml"
    assert load_ganas(path) == []
    path.write_text('[[gana]]\nid = "a"\nprompt = "hi"\nevery_minutes = 0.5\n'
                    '[[gana]]\nid = "b"\nprompt = "yo"\nevery_minutes = 2\nmodel_id = "tiny-2"\n'
                    "max_new_tokens = 16\n")
    a, b = load_ganas(path)
    assert (a.id, a.every_s, a.model_id) == ("a", 30.0, None)
    assert (b.model_id, b.max_new_tokens) == ("tiny-2", 16)
    for body, needle in [
        ('[[gana]]\nid = "a"\nprompt = "x"\nevery_minutes = 0\n', "every_minutes"),
        ('[[gana]]\nid = "a b"\nprompt = "x"\nevery_minutes = 1\n', "id must be"),
        ('[[gana]]\nid = "a"\nprompt = "x"\nevery_minutes = 1\ncron = "*"\n', "'cron'"),
        ('[[gana]]\nid = "a"\nprompt = "x"\nevery_minutes = 1\n'
         '[[gana]]\nid = "a"\nprompt = "y"\nevery_minutes = 1\n', "used twice"),
        ("[[gana]\n", "not valid TOML"),
    ]:
        path.write_text(body)
        with pytest.raises(GanaConfigError, match=needle):
            load_ganas(path)


def _claim(store: ResultsStore, owner: str, now: float, lease: float | None = None):
    return claim_fire(store, "g", owner=owner, due=lambda last: due_slot(last, E, now),
                      job_id_for=lambda s: fire_job_id("g", s), lease_s=lease, now=now)


def test_a_slot_is_claimed_once_whoever_asks(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "r.db") as store:
        first = _claim(store, OWNER_CRON, now=0.0)
        assert first is not None and first.slot == 0.0
        assert _claim(store, OWNER_BACKGROUND, now=1.0) is None
        second = _claim(store, OWNER_BACKGROUND, now=E + 1)
        assert second is not None and second.slot == E and second.owner == OWNER_BACKGROUND
        assert [f["slot"] for f in fires(store)] == [0.0, E]


def test_concurrent_claimers_in_two_connections_never_double_a_slot(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    ResultsStore(path).close()
    won: list[float] = []
    lock = threading.Lock()

    def claimer(owner: str) -> None:
        with ResultsStore(path) as store:
            for step in range(40):
                fire = _claim(store, owner, now=step * E / 4)
                if fire is not None:
                    with lock:
                        won.append(fire.slot)

    threads = [threading.Thread(target=claimer, args=(o,)) for o in (OWNER_CRON, OWNER_BACKGROUND)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == len(set(won)) and sorted(won) == [i * E for i in range(10)]


def test_finish_records_the_run_and_closes_the_claim_together(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "r.db") as store:
        fire = _claim(store, OWNER_CRON, now=0.0)
        assert fire is not None and open_fires(store, OWNER_CRON) == [fire]
        finish_fire(store, fire, {"runner": "scheduler", "model_id": "tiny-1", "prompt": "p",
                                  "text": "t", "finish_reason": "length", "total_s": 1.0})
        assert open_fires(store, OWNER_CRON) == []
        (run,) = store.gana_runs("g")
        assert (run["slot"], run["job_id"], run["text"]) == (0.0, fire.job_id, "t")


def test_a_dead_background_owners_claim_is_adopted_after_its_lease(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "r.db") as store:
        fire = _claim(store, OWNER_BACKGROUND, now=100.0, lease=30.0)
        assert fire is not None
        assert adopt_expired(store, OWNER_CRON, now=120.0) == []  # lease still running
        (adopted,) = adopt_expired(store, OWNER_CRON, now=131.0)
        assert (adopted.job_id, adopted.owner) == (fire.job_id, OWNER_CRON)
        assert open_fires(store, OWNER_BACKGROUND) == []
        cron_fire = _claim(store, OWNER_CRON, now=100.0 + E)
        assert cron_fire is not None
        assert adopt_expired(store, OWNER_BACKGROUND, now=10_000.0) == []  # cron's: never


def test_a_completion_style_gana_sends_its_prompt_as_raw_text() -> None:
    from uniun.actors.producers.gana_schedule import GanaConfigError, gana_job, parse_ganas

    [gana] = parse_ganas({"gana": [{"id": "fewshot", "every_minutes": 5, "style": "completion",
                                    "model_id": "gemma3-270m", "system": "Haiku, three lines.",
                                    "prompt": "Topic: rain\nHaiku:"}]})
    job = gana_job(gana, job_id="g-1", deadline=None)
    assert "messages" not in job
    assert job["prompt"] == "Haiku, three lines.\n\nTopic: rain\nHaiku:"
    with pytest.raises(GanaConfigError, match="style must be one of chat, completion"):
        parse_ganas({"gana": [{"id": "x", "every_minutes": 5, "prompt": "p", "style": "poem"}]})


def test_a_gana_may_declare_tools_as_a_job_does() -> None:
    from uniun.protocol.jobmap import validate_job

    weather = {"name": "get_weather", "description": "The weather in a city.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"]}}
    [gana] = parse_ganas({"gana": [{"id": "weather", "every_minutes": 60, "prompt": "Paris?",
                                    "tools": [weather], "tool_choice": "required"}]})
    job = gana_job(gana, job_id="gana-weather-1", deadline=None)
    assert job["tools"] == [weather] and job["tool_choice"] == "required"
    spec = validate_job(job, default_model="tiny-1")  # what the scheduler will take
    assert spec.tools is not None and spec.tools.active
    for bad, message in [({"tools": [{"name": "a b"}]}, "tools\\[0\\].name"),
                         ({"tool_choice": "required"}, "tool_choice needs tools"),
                         ({"tools": [weather], "style": "completion"}, "need style chat")]:
        with pytest.raises(GanaConfigError, match=message):
            parse_ganas({"gana": [{"id": "x", "every_minutes": 5, "prompt": "p", **bad}]})
