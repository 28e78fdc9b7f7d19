"""Request validation and reply/event builders of protocol v1 (docs/protocol.md)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import msgpack
import pytest

from uniun.protocol import messages as m, requests as rq
from uniun.protocol.codec import decode, encode
from uniun.protocol.errors import ErrorCode, ProtocolError

RULES = rq.JobRules(default_model="smollm2-135m", known_models=("smollm2-135m", "tiny"))
JOB = {"job_id": "j1", "kind": "chat", "messages": [{"role": "user", "content": "hi"}]}


def _req(mtype: str, **body: Any) -> dict[str, Any]:
    return {"v": 1, "type": mtype, "id": "r1", **body}


def _refused(msg: Any, rules: rq.JobRules = RULES, **kw: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        rq.parse_request(msg, rules, **kw)
    return info.value


# --- valid requests of every type ----------------------------------------------------

def test_every_client_request_type_parses_into_its_typed_form() -> None:
    sub = rq.parse_request(_req("submit", job=JOB), RULES)
    assert isinstance(sub, rq.Submit) and sub.id == "r1"
    assert sub.job.job_id == "j1" and sub.job.model_id == "smollm2-135m"
    assert sub.job.messages == (("user", "hi"),)
    assert rq.parse_request(_req("cancel", job_id="j1"), RULES) == rq.Cancel("r1", "j1")
    assert rq.parse_request(_req("attach", job_id="j1"), RULES) == rq.Attach("r1", "j1", -1)
    assert rq.parse_request(_req("attach", job_id="j1", after_seq=4), RULES) == rq.Attach(
        "r1", "j1", 4)
    assert rq.parse_request(_req("foreground", kind="extract"), RULES) == rq.Foreground(
        "r1", "extract")
    assert rq.parse_request(_req("foreground", kind=None), RULES) == rq.Foreground("r1", None)
    assert rq.parse_request(_req("lifecycle", state="background"), RULES) == rq.Lifecycle(
        "r1", "background")
    assert rq.parse_request(_req("status"), RULES) == rq.StatusRequest("r1")
    assert rq.parse_request(_req("ping"), RULES) == rq.Ping("r1")


def test_lifecycle_may_carry_the_devices_power_facts_and_v1_stays_as_it_was() -> None:
    from uniun.protocol.power_state import PowerState

    plain = rq.parse_request(_req("lifecycle", state="foreground"), RULES)
    assert plain == rq.Lifecycle("r1", "foreground", None)
    both = rq.parse_request(_req("lifecycle", state="background", power={
        "on_battery": True, "percent": 15, "thermal": "warm", "future_key": 1}), RULES)
    assert both == rq.Lifecycle("r1", "background", PowerState(
        on_battery=True, percent=15.0, thermal="warm"))
    only = rq.parse_request(m.req_lifecycle("r1", None, {"thermal": "hot"}), RULES)
    assert only == rq.Lifecycle("r1", None, PowerState(thermal="hot"))
    with pytest.raises(ValueError):
        m.req_lifecycle("r1", None)


def test_request_builders_produce_what_the_validator_accepts() -> None:
    built = [m.req_submit("a", JOB), m.req_cancel("b", "j1"), m.req_attach("c", "j1", 3),
             m.req_foreground("d", None), m.req_lifecycle("e", "foreground"),
             m.req_status("f"), m.req_ping("g")]
    parsed = [rq.parse_frame(encode(msg), RULES) for msg in built]
    assert [type(p).__name__ for p in parsed] == [
        "Submit", "Cancel", "Attach", "Foreground", "Lifecycle", "StatusRequest", "Ping"]
    assert [p.id for p in parsed] == list("abcdefg")


def test_unknown_extra_keys_are_ignored_for_forward_compatibility() -> None:
    assert rq.parse_request(_req("ping", trace="x", re="y"), RULES) == rq.Ping("r1")


# --- the envelope ----------------------------------------------------------------------

@pytest.mark.parametrize("version", [0, 2, 99, -1])
def test_other_versions_are_unsupported_version(version: int) -> None:
    err = _refused({"v": version, "type": "ping", "id": "x"})
    assert err.code is ErrorCode.UNSUPPORTED_VERSION
    assert m.reply_error(rq.reply_to({"id": "x"}), err)["re"] == "x"


@pytest.mark.parametrize("msg, field", [
    ({"type": "ping", "id": "x"}, "v"),
    ({"v": "1", "type": "ping", "id": "x"}, "v"),
    ({"v": True, "type": "ping", "id": "x"}, "v"),
    ({"v": 1.0, "type": "ping", "id": "x"}, "v"),
    ({"v": 1, "id": "x"}, "type"),
    ({"v": 1, "type": 5, "id": "x"}, "type"),
    ({"v": 1, "type": "ping"}, "id"),
    ({"v": 1, "type": "ping", "id": 7}, "id"),
    ({"v": 1, "type": "ping", "id": ""}, "id"),
    ({"v": 1, "type": "ping", "id": "x" * 129}, "id"),
])
def test_missing_or_mistyped_envelope_keys_are_invalid_field(msg: dict[str, Any],
                                                              field: str) -> None:
    err = _refused(msg)
    assert (err.code, err.field) == (ErrorCode.INVALID_FIELD, field)


@pytest.mark.parametrize("mtype", ["submit!", "SUBMIT", "embed", "accepted", "token", ""])
def test_unknown_types_are_unknown_type(mtype: str) -> None:
    err = _refused({"v": 1, "type": mtype, "id": "x"})
    assert err.code is ErrorCode.UNKNOWN_TYPE and err.field == "type"


def test_embed_is_known_only_where_the_server_allows_it() -> None:
    req = rq.parse_request(_req("embed", texts=["a", "b"]), RULES, allowed=m.EMBED_REQUESTS)
    assert req == rq.Embed("r1", ("a", "b"))
    assert _refused(_req("submit", job=JOB), allowed=m.EMBED_REQUESTS).code is (
        ErrorCode.UNKNOWN_TYPE)
    for texts, field in [(None, "texts"), ([], "texts"), (["a", 3], "texts[1]"),
                         (["a"] * (m.MAX_EMBED_TEXTS + 1), "texts")]:
        err = _refused(_req("embed", texts=texts), allowed=m.EMBED_REQUESTS)
        assert (err.code, err.field) == (ErrorCode.INVALID_FIELD, field)


def test_a_frame_that_is_not_msgpack_is_bad_envelope_via_parse_frame() -> None:
    for frame in (b"\xc1", msgpack.packb([1, 2]), msgpack.packb({1: 2})):
        with pytest.raises(ProtocolError) as info:
            rq.parse_frame(frame, RULES)
        assert info.value.code is ErrorCode.BAD_ENVELOPE
    assert _refused([1, 2]).code is ErrorCode.BAD_ENVELOPE


def test_reply_to_finds_an_address_only_in_a_valid_id() -> None:
    assert rq.reply_to({"id": "abc"}) == "abc"
    for bad in ({"id": 3}, {"id": ""}, {"id": "x" * 129}, {}, [1], None, b"x"):
        assert rq.reply_to(bad) is None


# --- bodies ----------------------------------------------------------------------------

@pytest.mark.parametrize("msg, field", [
    (_req("submit"), "job"),
    (_req("submit", job="text"), "job"),
    (_req("submit", job={"kind": "chat", "prompt": "x"}), "job_id"),
    (_req("submit", job={**JOB, "kind": "poetry"}), "kind"),
    (_req("submit", job={**JOB, "max_new_tokens": 0}), "max_new_tokens"),
    (_req("submit", job={**JOB, "dead_line": 5}), "dead_line"),
    (_req("submit", job={**JOB, "prompt": "both"}), "messages"),
    (_req("submit", job={**JOB, "sampling": {"temperature": -1}}), "sampling.temperature"),
    (_req("cancel"), "job_id"),
    (_req("cancel", job_id=5), "job_id"),
    (_req("cancel", job_id=""), "job_id"),
    (_req("attach"), "job_id"),
    (_req("attach", job_id="j", after_seq=-2), "after_seq"),
    (_req("attach", job_id="j", after_seq="3"), "after_seq"),
    (_req("attach", job_id="j", after_seq=True), "after_seq"),
    (_req("foreground"), "kind"),
    (_req("foreground", kind="poetry"), "kind"),
    (_req("foreground", kind=3), "kind"),
    (_req("lifecycle"), "state"),
    (_req("lifecycle", state="asleep"), "state"),
    (_req("lifecycle", state="background", power=[1]), "power"),
    (_req("lifecycle", power={"percent": 120}), "power.percent"),
    (_req("lifecycle", power={"percent": "full"}), "power.percent"),
    (_req("lifecycle", power={"on_battery": 1}), "power.on_battery"),
    (_req("lifecycle", power={"thermal": "toasty"}), "power.thermal"),
    (_req("lifecycle", power={"user_idle": "yes"}), "power.user_idle"),
    (_req("lifecycle", state="asleep", power={"percent": 50}), "state"),
])
def test_invalid_bodies_are_invalid_field_naming_the_field(msg: dict[str, Any],
                                                            field: str) -> None:
    err = _refused(msg)
    assert (err.code, err.field) == (ErrorCode.INVALID_FIELD, field)
    body = m.reply_error(rq.reply_to(msg), err)
    assert body["field"] == field and body["re"] == "r1" and body["retryable"] is False


def test_invalid_job_error_carries_the_job_id() -> None:
    err = _refused(_req("submit", job={**JOB, "max_new_tokens": -3}))
    assert err.job_id == "j1"
    assert m.reply_error("r1", err)["job_id"] == "j1"


def test_unknown_model_when_the_caller_lists_the_models() -> None:
    err = _refused(_req("submit", job={**JOB, "model_id": "gpt-9"}))
    assert (err.code, err.field, err.job_id) == (ErrorCode.UNKNOWN_MODEL, "model_id", "j1")
    ok = rq.parse_request(_req("submit", job={**JOB, "model_id": "tiny"}), RULES)
    assert isinstance(ok, rq.Submit) and ok.job.model_id == "tiny"
    open_rules = rq.JobRules(default_model="smollm2-135m")  # no list: not checked here
    assert isinstance(rq.parse_request(_req("submit", job={**JOB, "model_id": "gpt-9"}),
                                      open_rules), rq.Submit)


def test_job_rules_are_passed_to_the_job_validator() -> None:
    rules = rq.JobRules(default_model="x", kinds=("chat", "poetry"), max_new_tokens_cap=200)
    assert isinstance(rq.parse_request(_req("submit", job={**JOB, "kind": "poetry"}), rules),
                      rq.Submit)
    assert _refused(_req("submit", job={**JOB, "max_new_tokens": 201}), rules).field == (
        "max_new_tokens")
    assert rq.parse_request(_req("foreground", kind="poetry"), rules) == rq.Foreground(
        "r1", "poetry")


# --- replies and events ----------------------------------------------------------------

def test_reply_builders_match_protocol_md() -> None:
    assert m.reply_accepted("r", "j", "T2") == {
        "v": 1, "type": "accepted", "re": "r", "job_id": "j", "tier": "T2"}
    assert m.reply_accepted("r", "j", "T4", state="queued")["state"] == "queued"
    assert m.reply_cancelled("r", "j") == {"v": 1, "type": "cancelled", "re": "r", "job_id": "j"}
    assert m.reply_ok("r") == {"v": 1, "type": "ok", "re": "r"}
    assert m.reply_pong("r") == {"v": 1, "type": "pong", "re": "r"}
    status = m.reply_status("r", {"policy": "uniun", "queues": {"T0": ["a"]}})
    assert status["type"] == "status" and status["queues"] == {"T0": ["a"]}
    with pytest.raises(ValueError):
        m.reply_status("r", {"type": "x"})
    emb = m.reply_embeddings("r", 2, [b"\x00" * 8])
    assert emb["dim"] == 2 and emb["vectors"] == [b"\x00" * 8]
    with pytest.raises(ValueError):
        m.reply_embeddings("r", 2, [b"\x00" * 4])


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_error_code_builds_a_routable_reply_and_job_event(code: ErrorCode) -> None:
    reply = decode(encode(m.reply_error("r9", ProtocolError(code, "why", field="f"))))
    assert reply == {"v": 1, "type": "error", "re": "r9", "code": code.value,
                     "message": "why", "field": "f", "retryable": reply["retryable"]}
    assert m.classify(reply) == "reply"
    event = decode(encode(m.event_error("j", code, "why")))
    assert m.classify(event) == "event"
    assert event["code"] == code.value and event["job_id"] == "j"
    retryable = code in (ErrorCode.QUEUE_FULL, ErrorCode.RUNNER_FAILED, ErrorCode.SHUTTING_DOWN)
    assert reply["retryable"] is retryable and event["retryable"] is retryable
    assert m.event_error("j", code, "why", retryable=True)["retryable"] is True


def test_unaddressable_error_has_no_re() -> None:
    err = ProtocolError(ErrorCode.BAD_ENVELOPE, "not msgpack")
    assert "re" not in m.reply_error(None, err)


def test_job_event_builders_match_protocol_md_and_check_their_arguments() -> None:
    assert m.event_started("j", "tiny", True, "T1") == {
        "v": 1, "type": "started", "job_id": "j", "model_id": "tiny", "resumed": True,
        "tier": "T1"}
    assert m.event_token("j", 0, "Hi") == {"v": 1, "type": "token", "job_id": "j", "seq": 0,
                                           "text": "Hi"}
    for reason in m.PAUSE_REASONS:
        assert m.event_paused("j", reason)["reason"] == reason
    done = m.event_done("j", text="Hi.", finish_reason="length", prompt_tokens=5,
                        completion_tokens=2, queued_s=0.5, ttft_s=None, total_s=1,
                        preemptions=1)
    assert done["usage"] == {"prompt_tokens": 5, "completion_tokens": 2}
    assert done["timings"] == {"queued_s": 0.5, "ttft_s": None, "total_s": 1.0}
    assert done["preemptions"] == 1 and done["finish_reason"] == "length"
    with pytest.raises(ValueError):
        m.event_paused("j", "bored")
    with pytest.raises(ValueError):
        m.event_token("j", -1, "x")
    with pytest.raises(ValueError):
        m.event_done("j", text="", finish_reason="eos", prompt_tokens=1, completion_tokens=0,
                     queued_s=0, ttft_s=0, total_s=0, preemptions=0)
    with pytest.raises(ValueError):
        m.req_lifecycle("x", "asleep")


@pytest.mark.parametrize("msg", [
    {"v": 1, "type": "token", "job_id": "j", "seq": "0", "text": "x"},
    {"v": 1, "type": "token", "job_id": "j", "text": "x"},
    {"v": 1, "type": "done"},
    {"v": 2, "type": "pong", "re": "x"},
    {"v": 1, "type": "mystery", "job_id": "j"},
])
def test_classify_rejects_server_messages_a_client_cannot_route(msg: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        m.classify(msg)


def test_protocol_room_imports_no_pykka_onnxruntime_and_its_core_no_zmq() -> None:
    code = (
        "import sys\n"
        "import uniun.protocol.codec, uniun.protocol.messages, uniun.protocol.endpoints\n"
        "import uniun.protocol.errors, uniun.protocol.jobmap\n"
        "core = sorted(m for m in ('zmq', 'pykka', 'onnxruntime') if m in sys.modules)\n"
        "import uniun.protocol.client\n"
        "everything = sorted(m for m in ('pykka', 'onnxruntime') if m in sys.modules)\n"
        "print(core, everything)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[] []"


@pytest.mark.parametrize("model_id", [".", "..", "/tmp", "../../etc/passwd", "\U0001F600",
                                      "tiny\x00", "tiny\n", "TINY", "-tiny", "a" * 65])
def test_a_model_id_outside_the_store_name_format_is_invalid_field(model_id: str) -> None:
    # Even with no model list to check against: the name can never be a store folder.
    open_rules = rq.JobRules(default_model="smollm2-135m")
    err = _refused(_req("submit", job={**JOB, "model_id": model_id}), open_rules)
    assert (err.code, err.field, err.job_id) == (ErrorCode.INVALID_FIELD, "model_id", "j1")


def test_a_huge_unknown_key_is_named_short_enough_to_fit_in_a_reply() -> None:
    for job in ({**JOB, "k" * 500_000: 1}, {**JOB, "sampling": {"s" * 500_000: 1}},
                {**JOB, "format": {"f" * 500_000: 1}}):
        err = _refused(_req("submit", job=job))
        assert err.code == ErrorCode.INVALID_FIELD and len(err.field) < 100
        assert len(err.message) < 200


def test_an_empty_prompt_is_refused_before_it_reaches_the_runner() -> None:
    err = _refused(_req("submit", job={"job_id": "j1", "kind": "chat", "prompt": ""}))
    assert (err.code, err.field) == (ErrorCode.INVALID_FIELD, "prompt")
