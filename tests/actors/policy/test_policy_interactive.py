"""``interactive()``: the policy's answer to "is a chat or a foreground job in flight?"."""

from __future__ import annotations

from uniun.actors.policy import make_policy
from uniun.actors.policy.config import PolicyConfig
from uniun.protocol.jobmap import JobSpec


def spec(job_id: str, kind: str, **extra: object) -> JobSpec:
    return JobSpec(job_id=job_id, kind=kind, model_id="m", prompt="x", **extra)


def policy():
    now = [0.0]
    return make_policy("uniun", PolicyConfig(), lambda: now[0])


def test_a_queued_or_running_chat_is_interactive_until_it_ends() -> None:
    p = policy()
    p.on_model_loaded("m")
    p.submit(spec("bg", "nataraj"))
    assert not p.interactive()
    p.submit(spec("c1", "chat"))
    assert p.interactive()
    d = p.decide()
    assert d.job_id == "c1"
    p.on_started("c1")
    assert p.interactive()
    p.on_finished("c1", 0.1)
    assert not p.interactive()


def test_a_cancelled_waiting_chat_stops_being_interactive() -> None:
    p = policy()
    p.submit(spec("c1", "chat"))
    p.cancel("c1")
    assert not p.interactive()


def test_the_foreground_kind_is_interactive_extract_only_with_the_hint() -> None:
    p = policy()
    p.submit(spec("n1", "nataraj"))
    p.submit(spec("e1", "extract"))
    assert not p.interactive()
    p.set_foreground("nataraj")
    assert p.interactive()
    p.set_foreground("extract")
    assert not p.interactive()
    p.submit(spec("e2", "extract", foreground_hint=True))
    assert p.interactive()
    p.set_foreground(None)
    assert not p.interactive()
