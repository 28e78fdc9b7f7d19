"""The real SmolLM2-135M-Instruct end to end: preemption and a runner crash lose nothing.

A background job's greedy text is the same whether it ran alone, was preempted by a chat
(paused, resumed from its snapshot), or lost its runner to SIGKILL mid-generation
(resumed on a new runner by recompute) — and a chat gets its answer first.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from uniun.runtime.runner_main import TOKEN_PACE_ENV

from .harness import Runtime, Wire, assert_gap_free, tokens_of, wait_tokens

pytestmark = [pytest.mark.integration, pytest.mark.smollm2]

CONFIG = """\
[models]
chat_model = "smollm2-135m-instruct"
pull_on_start = false

[supervisor]
heartbeat_interval_s = 1.0
missed_heartbeats = 5
stop_grace_s = 6
"""

# Chosen by measuring: greedy SmolLM2 answers this with a logit margin of at least 0.5
# between its first and second choice at every token, so the tiny float differences
# between computation paths (a snapshot, a prefix-cache hit, a recompute in one pass)
# cannot flip a token. A near-tie prompt would make "the same text" a coin toss.
STORY = {"kind": "extract", "max_new_tokens": 64,
         "messages": [{"role": "user", "content": "Recite the months of the year."}]}

# SmolLM2 makes a token in milliseconds on a fast machine, and STORY is about 60 tokens:
# at this least pace the story lasts over a second, time for a chat to land in it and for
# a kill to hit it mid-way, however fast the machine.
STORY_PACE_S = 0.02


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, smollm2: str) -> Iterator[Runtime]:
    runtime = Runtime(tmp_path_factory.mktemp("rt-smollm2"), CONFIG)
    runtime.env[TOKEN_PACE_ENV] = str(STORY_PACE_S)
    runtime.start()
    try:
        yield runtime
    finally:
        runtime.stop()
        print(runtime.logs())


def story(w: Wire, job_id: str) -> dict:
    assert w.submit({"job_id": job_id, **STORY})["type"] == "accepted"
    return w.end(job_id)


def test_smollm2_background_text_survives_a_chat_and_a_runner_kill(rt: Runtime) -> None:
    w = rt.wire()
    alone = story(w, "alone")
    assert alone["type"] == "done" and alone["usage"]["completion_tokens"] > 20
    assert alone["preemptions"] == 0 and "January" in alone["text"]

    w.submit({"job_id": "preempted", **STORY})
    wait_tokens(w, "preempted", 3)
    w.submit({"job_id": "chat", "kind": "chat", "max_new_tokens": 16,
              "messages": [{"role": "user", "content": "What is the capital of Japan?"}]})
    chat = w.end("chat")
    preempted = w.end("preempted")
    assert chat["type"] == "done" and "Tokyo" in chat["text"]
    assert w.index("preempted", "paused") < w.index("chat", "started")
    assert w.log.index(chat) < w.log.index(preempted)
    assert preempted["preemptions"] == 1 and preempted["text"] == alone["text"]
    assert_gap_free(w.events("preempted"))

    w.submit({"job_id": "killed", **STORY})
    wait_tokens(w, "killed", 6)
    rt.kill("runner", signal.SIGKILL)
    killed = w.end("killed")
    assert killed["type"] == "done", killed
    events = w.events("killed")
    assert_gap_free(events)
    assert [e["resumed"] for e in events if e["type"] == "started"] == [False, True]
    assert "".join(t["text"] for t in tokens_of(events)) == killed["text"] == alone["text"]
