"""Chats of different HTTP clients share the runner (docs/scheduling.md, T0), through the
real gateway and the official ``openai`` SDK.

Two clients as the gateway tells them apart (docs/http.md, "Bounds per client"): a
program that sends no cookie, and a browser-like client with the console's cookie. The
assertions are about order and text, never time: each long request is long by its token
count at the runtime's test token pace.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.wait import WAIT_S, wait_for

from .harness import BASE_CONFIG, LONG, Runtime, serving

pytestmark = pytest.mark.integration

CONFIG = BASE_CONFIG + "\n[http]\nport = 0\n"
LONG_TOKENS = LONG  # per choice: long by its token count at the test token pace
CHAT = [{"role": "user", "content": "Hello! How are you?"}]
COOKIE = "uniun_client=fair-chat-test-browser-01"


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Iterator[Runtime]:
    with serving(tmp_path_factory.mktemp("rt-fair"), CONFIG, "scheduler,runner,http") as r:
        yield r


def _client(rt: Runtime, cookie: str | None = None) -> openai.OpenAI:
    headers = {"Cookie": cookie} if cookie else None
    return openai.OpenAI(base_url=f"{rt.gateway_url()}/v1", api_key="unused", max_retries=0,
                         timeout=WAIT_S, default_headers=headers)


def _running(rt: Runtime, prefix: str, tokens: int = 3) -> str | None:
    """The id of the running job if it starts with ``prefix`` and is generating."""
    st = rt.status(timeout=2.0) or {}
    running = st.get("running") or {}
    job = running.get("job_id") or ""
    return job if job.startswith(prefix) and running.get("tokens", 0) >= tokens else None


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as err:  # noqa: BLE001 - reported by the test
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_chat_is_answered_before_another_clients_n4_chat_ends_which_keeps_its_text(
        rt: Runtime) -> None:
    other, user = _client(rt), _client(rt, COOKIE)
    thread, out = _in_thread(lambda: other.chat.completions.with_raw_response.create(
        model="tiny-1", messages=CHAT, n=4, max_tokens=LONG_TOKENS, temperature=0,
        extra_body={"uniun": {"job_id": "other-n4"}}).parse())
    assert wait_for("one of the other client's choices to stream",
                    lambda: _running(rt, "other-n4-") or "error" in out)
    answer = user.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=8,
                                          temperature=0)
    assert answer.choices[0].message.content
    still_running = thread.is_alive()
    thread.join(WAIT_S)
    assert "error" not in out, out.get("error")
    assert still_running, "the user's chat waited for all four of the other's choices"
    full = out["result"]
    texts = [c.message.content for c in full.choices]
    # Greedy: every choice is the same text, the one paused for the user's chat included
    # (parked and resumed, not restarted or cut).
    assert len(set(texts)) == 1 and all(c.finish_reason == "length" for c in full.choices)
    jobs = (full.model_extra or {})["uniun"]["jobs"]
    assert sum(j["preemptions"] for j in jobs) >= 1


def test_many_connections_of_one_client_are_one_client(rt: Runtime) -> None:
    # A program without a cookie opens three connections at once (three SDK clients);
    # the gateway tells the scheduler they are one client.
    programs = [_client(rt) for _ in range(3)]
    runs = [_in_thread(lambda p=p, i=i: p.chat.completions.create(
        model="tiny-1", messages=CHAT, max_tokens=LONG_TOKENS, temperature=0,
        extra_body={"uniun": {"job_id": f"prog-{i}"}})) for i, p in enumerate(programs)]
    first = wait_for("the program's three chats to be live, one of them streaming",
                     lambda: _live_chats(rt) == 3 and _running(rt, "prog-"))
    assert (rt.status() or {})["chat_clients"] == 1
    browser = _client(rt, COOKIE)
    answer = browser.chat.completions.create(model="tiny-1", messages=CHAT, max_tokens=8,
                                             temperature=0)
    assert answer.choices[0].message.content
    alive = [t.is_alive() for t, _ in runs]
    preemptions = {}
    for i, (thread, out) in enumerate(runs):
        thread.join(WAIT_S)
        assert "error" not in out, out.get("error")
        preemptions[f"prog-{i}"] = (out["result"].model_extra or {})["uniun"]["preemptions"]
    # The browser's chat did not wait behind the program's three: it had its turn while
    # all of them were open, taking it from the one that streamed.
    assert all(alive)
    assert preemptions[first] >= 1
    # The three are one client: they ran one after the other, never taking turns.
    assert all(n == 0 for job, n in preemptions.items() if job != first)


def _live_chats(rt: Runtime) -> int:
    st = rt.status(timeout=2.0) or {}
    queued = len((st.get("queues") or {}).get("T0", []))
    running = st.get("running") or {}
    return queued + (1 if running.get("kind") == "chat" else 0)
