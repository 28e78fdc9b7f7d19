"""A chat that arrives while a background job prefills a long prompt is served first.

The runner feeds a prompt in passes of bounded time and aborts the pass in flight when
a command preempts the job (docs/scheduler-runner.md, "Bounded passes"), so a chat never
waits for a background prefill to finish. The prefill is made long by a deterministic
knob, not by hoping the machine is slow: the runner's test pace makes every prompt
position take at least PASS_PACE_S (runtime/runner_main.py PASS_PACE_ENV), so the
background prefill lasts at least PROMPT_WORDS x PASS_PACE_S however fast the machine.
The assertion is an order of events, never a time.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from uniun.runtime.runner_main import PASS_PACE_ENV

from .harness import Runtime, assert_gap_free, chat_job, tokens_of

pytestmark = pytest.mark.integration

PASS_PACE_S = 0.02
PROMPT_WORDS = 250  # >= 250 prompt positions: a prefill of at least 5 s at the pace


def test_a_chat_gets_its_first_token_before_a_background_prefill_completes(
        make_runtime: Callable[..., Runtime]) -> None:
    rt = make_runtime(env={PASS_PACE_ENV: str(PASS_PACE_S)})
    w = rt.wire()
    prompt = " ".join(f"word{i}" for i in range(PROMPT_WORDS))
    assert w.submit({"job_id": "bg", "kind": "nataraj", "prompt": prompt,
                     "max_new_tokens": 4})["type"] == "accepted"
    w.wait(lambda m: m.get("job_id") == "bg" and m["type"] == "started")
    assert w.submit(chat_job("chat", max_new_tokens=4))["type"] == "accepted"
    assert w.end("chat")["type"] == "done"
    bg_end = w.end("bg")
    assert bg_end["type"] == "done" and bg_end["usage"]["prompt_tokens"] >= PROMPT_WORDS
    # The chat's first token came while the background job had none: its prefill was
    # cut short for the chat, not finished first.
    assert w.index("chat", "token") < w.index("bg", "token")
    assert w.index("bg", "paused") < w.index("chat", "token")
    assert bg_end["preemptions"] >= 1
    assert_gap_free(w.events("bg"))
    assert len(tokens_of(w.events("bg"))) == 4
