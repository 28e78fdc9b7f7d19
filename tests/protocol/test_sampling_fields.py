"""The sampling controls' one declaration (``protocol/sampling_fields.py``), walked through
every surface that takes them: the wire's job map, the sampler's ``SamplingParams``, the
OpenAI dialect and the CLI's flags. What a user notices: a value at a control's bound is
taken everywhere, one just past it is refused everywhere, by the same rule in the same
words, naming the field as that surface spells it."""

from __future__ import annotations

import math
from typing import Any

import pytest

from uniun.actors.gateway import openai_map as om
from uniun.actors.gateway.errors import ApiError
from uniun.models.sampling import SamplingParams
from uniun.protocol import requests as rq
from uniun.protocol.errors import ErrorCode, ProtocolError
from uniun.protocol.sampling_fields import CONTROLS, Control
from uniun.runtime.cli import build_parser

RULES = rq.JobRules(default_model="m")
CHAT = [{"role": "user", "content": "hi"}]


def _edges(control: Control, high: float | None) -> tuple[list[Any], list[Any]]:
    """(values at the bounds, values just past them) for a range whose top is ``high``."""
    if control.kind is int:
        inside = [int(control.low)] + ([] if high is None else [int(high)])
        outside = [int(control.low) - 1] + ([] if high is None else [int(high) + 1])
        return inside, outside
    low = math.nextafter(control.low, math.inf) if control.low_open else control.low
    below = control.low if control.low_open else math.nextafter(control.low, -math.inf)
    assert high is not None
    return [low, high], [below, math.nextafter(high, math.inf)]


CASES = [(key, value, ok)
         for key, control in CONTROLS.items()
         for ok, values in zip((True, False), _edges(control, control.high))
         for value in values]
OPENAI_CASES = [(key, name, value, ok)
                for key, control in CONTROLS.items()
                for name in control.openai_names
                for ok, values in zip((True, False), _edges(
                    control, control.openai_high or control.high))
                for value in values]


def _submit(sampling: dict[str, Any]) -> rq.Submit:
    req = rq.parse_request({"v": 1, "type": "submit", "id": "r1", "job": {
        "job_id": "j1", "kind": "chat", "messages": CHAT, "sampling": sampling}}, RULES)
    assert isinstance(req, rq.Submit)
    return req


@pytest.mark.parametrize("key, value, ok", CASES)
def test_the_wire_takes_each_bound_and_refuses_past_it(key: str, value: Any, ok: bool) -> None:
    if ok:
        assert _submit({key: value}).job.sampling.to_map() == {key: value}
        return
    with pytest.raises(ProtocolError) as err:
        _submit({key: value})
    assert err.value.code is ErrorCode.INVALID_FIELD and err.value.field == f"sampling.{key}"
    assert err.value.message == f"sampling.{key}: {CONTROLS[key].rule()}"


@pytest.mark.parametrize("key, value, ok", CASES)
def test_the_sampler_takes_each_bound_and_refuses_past_it(key: str, value: Any,
                                                         ok: bool) -> None:
    if ok:
        assert getattr(SamplingParams.coerce({key: value}), key) == value
        return
    with pytest.raises(ValueError) as err:
        SamplingParams(**{key: value})
    assert str(err.value) == f"{key} {CONTROLS[key].rule()}, got {value!r}"


@pytest.mark.parametrize("key, name, value, ok", OPENAI_CASES)
def test_the_openai_dialect_takes_each_bound_and_refuses_past_it(key: str, name: str,
                                                                 value: Any, ok: bool) -> None:
    body = {"model": "m", "messages": CHAT, name: value}
    if ok:
        job = om.chat_job(body, default_max_tokens=8, now=0.0).job
        assert job["sampling"][key] == value
        assert _submit(job["sampling"]).job.sampling.to_map()[key] == value  # the wire too
        return
    with pytest.raises(ApiError) as err:
        om.chat_job(body, default_max_tokens=8, now=0.0)
    control = CONTROLS[key]
    assert err.value.status == 400 and err.value.param == name
    assert err.value.message == f"{name} {control.rule(high=control.openai_high)}"


@pytest.mark.parametrize("key, value, ok", CASES)
def test_the_cli_takes_each_bound_and_refuses_past_it(key: str, value: Any, ok: bool,
                                                      capsys: pytest.CaptureFixture) -> None:
    control = CONTROLS[key]
    parser = build_parser()
    for flag in (control.flag, *control.flag_aliases):
        argv = ["submit", "--kind", "chat", f"{flag}={value!r}", "hi"]
        if ok:
            assert getattr(parser.parse_args(argv), f"s_{key}") == value
            continue
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        said = capsys.readouterr().err
        assert control.flag in said and control.rule() in said  # before any connection


def test_the_openai_dialect_keeps_its_own_temperature_cap_and_says_it() -> None:
    """OpenAI's range is 0-2; the wire's 0-10: a declared narrowing, not a drift."""
    control = CONTROLS["temperature"]
    assert control.openai_high == 2.0 and control.high == 10.0
    with pytest.raises(ApiError) as err:
        om.chat_job({"model": "m", "messages": CHAT, "temperature": 3},
                    default_max_tokens=8, now=0.0)
    assert err.value.message == "temperature must be a number in [0, 2] (0 = greedy)"


def test_two_openai_names_of_one_control_must_agree() -> None:
    body = {"model": "m", "messages": CHAT, "repetition_penalty": 1.1, "repeat_penalty": 1.2}
    with pytest.raises(ApiError) as err:
        om.chat_job(body, default_max_tokens=8, now=0.0)
    assert err.value.param == "repeat_penalty"
    same = om.chat_job({**body, "repeat_penalty": 1.1}, default_max_tokens=8, now=0.0)
    assert same.job["sampling"]["repetition_penalty"] == 1.1


def test_absent_controls_take_the_declared_neutral_values() -> None:
    assert SamplingParams().to_map() == {k: c.neutral for k, c in CONTROLS.items()}
    assert SamplingParams.coerce(_submit({}).job.sampling) == SamplingParams()
