"""The gateway's door on a real runtime: what a web page, a lying client or a buggy one
gets, with the ``openai`` SDK where it can send the request and raw ``http.client`` /
sockets where it cannot (a foreign ``Host``, a form post, a length it never sends).

Each refusal is checked for what a user would notice: the status, an OpenAI error
object, and that no job ran (the request's own ``uniun.job_id`` is unknown to the
scheduler afterwards). Then the HTTP fuzzer (runtime/chaos/http_fuzz.py) runs a bounded
sample against the same gateway: no 5xx, OpenAI error objects only, nothing internal,
the gateway's RSS within its budget and its pid unchanged.

The runtime: scheduler, runner (the tiny model), embedding pool, gateway on a free port.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.wait import WAIT_S, wait_for
from uniun.runtime.chaos.http_drafts import Target
from uniun.runtime.chaos.http_fuzz import run_http_fuzz
from uniun.runtime.chaos.http_probes import run_probes

from .harness import BASE_CONFIG, Runtime, serving

pytestmark = pytest.mark.integration

CONFIG = BASE_CONFIG.replace("[embed]\nenabled = false", "[embed]\nenabled = true\nworkers = 1") \
    + "\n[http]\nport = 0\n"
FUZZ_REQUESTS = 2000  # the bounded run; `uniun-runtime fuzz --http` does the long ones
CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, tiny_model: str, minilm_dir: Path
       ) -> Iterator[Runtime]:
    with serving(tmp_path_factory.mktemp("rt-door"),
                 CONFIG, "scheduler,runner,embed,http") as runtime:
        yield runtime


@pytest.fixture(scope="module")
def port(rt: Runtime) -> int:
    url = rt.gateway_url()
    number = int(url.rsplit(":", 1)[1])
    wait_for("the gateway to be ready", lambda: raw("GET", "/health", number)[0] == 200)
    return number


def raw(method: str, path: str, port: int, body: bytes | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """One request with exactly these headers (Host included), via http.client."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        sent = {"Host": f"127.0.0.1:{port}", **(headers or {})}
        if body is not None:
            sent.setdefault("Content-Type", "application/json")
            sent["Content-Length"] = str(len(body))
        for name, value in sent.items():
            conn.putheader(name, value)
        conn.endheaders(body)
        reply = conn.getresponse()
        data = reply.read()
        return reply.status, json.loads(data) if data else {}
    finally:
        conn.close()


def chat_body(job_id: str, **extra: Any) -> bytes:
    return json.dumps({"model": "tiny-1", "messages": CHAT, "max_tokens": 2,
                       "uniun": {"job_id": job_id}, **extra}).encode()


def assert_error(answer: dict[str, Any], code: str) -> None:
    assert set(answer["error"]) == {"message", "type", "param", "code"}
    assert answer["error"]["code"] == code, answer


def assert_no_job(rt: Runtime, job_id: str) -> None:
    reply = rt.wire().request("attach", job_id=job_id)
    assert reply["type"] == "error" and reply["code"] == "not_found", reply


@pytest.fixture(scope="module")
def client(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                         max_retries=0, timeout=WAIT_S)


def test_a_rebinding_page_host_is_421_and_runs_nothing(rt: Runtime, port: int) -> None:
    status, answer = raw("POST", "/v1/chat/completions", port, chat_body("door-host"),
                         {"Host": f"evil.example:{port}"})
    assert status == 421
    assert_error(answer, "invalid_host")
    assert_no_job(rt, "door-host")
    assert raw("GET", "/health", port, headers={"Host": "evil.example"})[0] == 421


def test_a_cross_site_form_post_is_refused_and_runs_nothing(rt: Runtime, port: int) -> None:
    status, answer = raw("POST", "/v1/chat/completions", port, chat_body("door-form"),
                         {"Origin": "http://evil.example", "Content-Type": "text/plain"})
    assert status == 403
    assert_error(answer, "invalid_origin")
    assert_no_job(rt, "door-form")


def test_a_text_plain_body_is_415_and_runs_nothing(rt: Runtime, port: int) -> None:
    status, answer = raw("POST", "/v1/chat/completions", port, chat_body("door-text"),
                         {"Content-Type": "text/plain"})
    assert status == 415
    assert_error(answer, "unsupported_media_type")
    assert_no_job(rt, "door-text")


def test_the_sdk_is_let_in_and_a_foreign_origin_through_it_is_not(port: int,
                                                                   client: openai.OpenAI) -> None:
    same = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                         max_retries=0, timeout=WAIT_S,
                         default_headers={"Origin": f"http://127.0.0.1:{port}"})
    assert same.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=2
                                        ).usage.completion_tokens == 2
    foreign = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                            max_retries=0, timeout=WAIT_S,
                            default_headers={"Origin": "http://evil.example"})
    with pytest.raises(openai.PermissionDeniedError) as err:
        foreign.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=2)
    assert err.value.code == "invalid_origin"


def test_a_256_mib_length_is_413_before_the_body(port: int) -> None:
    """Headers declaring 256 MiB and a few bytes: the answer comes with nothing more sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 268435456\r\n\r\n"
                     b'{"model": ')
        data = b""
        while piece := conn.recv(65536):
            data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 413 Request Entity Too Large"
    assert_error(json.loads(body), "bad_envelope")


def test_a_chunked_body_past_the_limit_is_cut_off_with_413(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 65536
        try:
            for _ in range((1 << 20) // len(chunk) + 2):  # just past 1 MiB, then stop
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while we were still sending
        data = b""
        while piece := conn.recv(65536):
            data += piece
    assert data.startswith(b"HTTP/1.1 413")


def test_an_oversized_body_from_the_sdk_is_a_413_it_can_read(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="tiny-1", max_tokens=2, messages=[
            {"role": "user", "content": "x" * (2 << 20)}])
    assert err.value.status_code == 413


@pytest.mark.parametrize(("body", "param"), [
    ((b'{"model": "tiny-1", "max_tokens": 2, "messages": [{"role": "user", '
     b'"content": "a\\ud800b"}]}'), "messages[0].content"),
    (b'{"model": "tiny-1", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None),
    (b'{"model": "tiny-1", "max_tokens": 2, "messages": [], "seed": 1e999}', "seed"),
    (b'{"model": "tiny-1", "max_tokens": 18446744073709551616, "messages": []}',
     "max_tokens"),
    (b'{"model": "tiny-1", "max_tokens": 2, "temperature": NaN, "messages": []}', None),
    (b'{"model": "tiny-1"', None),
])
def test_a_malformed_body_is_400_naming_it(rt: Runtime, port: int, body: bytes,
                                           param: str | None) -> None:
    status, answer = raw("POST", "/v1/chat/completions", port, body)
    assert status == 400
    assert_error(answer, "bad_envelope")
    assert answer["error"]["param"] == param


def test_wrong_types_through_the_sdk_are_400(client: openai.OpenAI) -> None:
    for extra in ({"temperature": "hot"}, {"max_tokens": 2**70}, {"seed": -1},
                  {"stop": [1, 2]}, {"extra_body": {"uniun": {"deadline": "soon"}}},
                  {"extra_body": {"uniun": {"job_id": 2**70}}}):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="tiny-1", messages=CHAT, **extra)


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_longer_than_the_context_is_400_streamed_or_not(client: openai.OpenAI,
                                                                  stream: bool) -> None:
    """The runner refuses it at its start; a stream's status waits for that start."""
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny-1", prompt="x" * 5000, max_tokens=2,
                                  stream=stream)
    assert err.value.code == "context_length_exceeded"
    assert "context" in err.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny-1", max_tokens=2, stream=stream,
                                       messages=[{"role": "user", "content": "x" * 5000}])


def test_health_and_refusals_say_nothing_internal(rt: Runtime, port: int) -> None:
    status, answer = raw("GET", "/health", port)
    assert status == 200 and answer == {"status": "ok", "reason": "ready"}
    text = json.dumps([raw("POST", "/v1/embeddings", port, b'{"model": "all-minilm-l6-v2", '
                           b'"input": ["' + b"x" * 1_100_000 + b'"]}'),
                       raw("POST", "/v1/completions", port, b'{"model": "tiny-1", '
                           b'"max_tokens": 2, "prompt": "' + b"y" * 1_040_000 + b'"}')])
    assert str(rt.home) not in text and "ipc://" not in text and "Traceback" not in text


def test_the_door_probes_find_the_door_shut(port: int) -> None:
    results = {p.name: p for p in run_probes("127.0.0.1", port, "tiny-1")}
    assert not any(p.answered for p in results.values()), results
    huge = results["declared_256mib"]
    assert huge.status == 413 and huge.body_bytes_sent == 0, huge


def test_a_bounded_fuzz_run_finds_no_5xx_and_no_open_door(rt: Runtime, port: int) -> None:
    status = rt.status()
    assert status is not None
    pid = status["processes"].get("http")
    target = Target("127.0.0.1", port, "tiny-1", "all-minilm-l6-v2")

    def pid_now() -> int | None:
        now = rt.status()
        return None if now is None else now["processes"].get("http")

    report = run_http_fuzz(target, FUZZ_REQUESTS, seed=27, gateway_pid=pid,
                           markers=(str(rt.home),), pid_after=pid_now)
    print(report.text())
    assert report.requests == FUZZ_REQUESTS
    assert report.ok, "\n".join(report.violations)
    assert report.statuses[200] > 0 and report.five_xx == 0


def test_the_fuzz_command_prints_a_verdict_and_writes_its_report(rt: Runtime, port: int,
                                                                  tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    out = tmp_path / "http-fuzz.json"
    env = dict(os.environ, UNIUN_HOME=str(rt.home), UNIUN_CONFIG=str(rt.config_path))
    done = subprocess.run([sys.executable, "-m", "uniun.runtime", "fuzz", "--http",
                           "--requests", "40", "--seed", "3", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: OK" in done.stdout and "probe declared_256mib  413 refused" in done.stdout
    report = json.loads(out.read_text())
    assert report["ok"] and report["fuzz"]["requests"] == 40
    assert report["url"] == f"http://127.0.0.1:{port}"
    assert report["fuzz"]["gateway_pid"][0] == rt.status()["processes"]["http"]
    empty = tmp_path / "no-runtime"
    empty.mkdir()
    none = subprocess.run([sys.executable, "-m", "uniun.runtime", "fuzz", "--http"],
                          env={**env, "UNIUN_HOME": str(empty), "UNIUN_CONFIG": ""},
                          capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert none.returncode == 2 and "no HTTP gateway is serving" in none.stderr
