"""``uniun-runtime bench --bounded-passes``: a chat never waits for background work in flight.

Against a real runtime of ``--model`` (``BenchRuntime``: temporary home, shared store):

- ``ttft_idle_s``: chat time to first token with nothing else running.
- ``ttft_bg_prefill_s``: the same while a background job prefills a long prompt
  (``prompt_tokens``, ~1,700). The chat is sent a share of the way into the prefill
  (0.2, 0.4, 0.6 of the prefill's solo time, in turn, after the job's ``started``), and
  ``chat_inside_prefill`` counts the chats whose first token came before the background
  job's first token (the chat really met a prefill).
- ``ttft_bg_decode_s``: the same while a background job decodes (after 4 tokens).
- ``bg_prefill_solo_s``: the background job's submit -> first token alone;
  ``bg_text_same``: every preempted background job ended with the text of its solo run.
- ``ratios``: prefill / idle and decode / idle (goals: <= 1.15 for a 3B model; <= 1.05
  decode at 135M).

Each runtime runs twice: as configured (passes sized in time, ``bounded``) and with
fixed 64-position passes (``fixed_64``: ``[runner] pass_target_ms = 0``,
``prefill_chunk_max = 64``); both abort the pass in flight on a preemption. Then, in
process (``bounded_session.py``): the bound's cost to prefill throughput, and a
2,000-token snapshot parked, spilled and resumed against recomputing it.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniun.models.convert.recipes import ensure_model
from uniun.models.store import ModelStore
from uniun.models.tokenizer import load_tokenizer
from uniun.protocol import messages as m
from uniun.runtime.bench.bounded_session import long_text, run as run_session
from uniun.runtime.bench.e2e import BG_PROMPT, WAIT_S, BenchRuntime, _chat_once
from uniun.runtime.paths import models_dir

Log = Callable[[str], None]
SHARES = (0.2, 0.4, 0.6)  # how far into the background prefill each chat is sent
VARIANTS = {"bounded": "", "fixed_64": "[runner]\npass_target_ms = 0\nprefill_chunk_max = 64\n"}


class _Job(threading.Thread):
    """One background job on its own client; every event timestamped."""

    def __init__(self, rt: BenchRuntime, prompt: str, tokens: int) -> None:
        super().__init__(daemon=True)
        self.rt, self.prompt, self.tokens = rt, prompt, tokens
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.started, self.streaming = threading.Event(), threading.Event()
        self.sent = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.rt.client() as client:
                self.sent = time.monotonic()
                stream = client.submit({"job_id": f"bench-bg-{uuid.uuid4().hex[:10]}",
                                        "kind": "nataraj", "prompt": self.prompt,
                                        "max_new_tokens": self.tokens})
                for event in stream:
                    self.events.append((time.monotonic(), event))
                    if event["type"] == m.STARTED:
                        self.started.set()
                    if event["type"] == m.TOKEN and event["seq"] >= 3:
                        self.streaming.set()
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            self.error = err
        finally:
            self.started.set()
            self.streaming.set()

    def first_token_at(self) -> float | None:
        return next((at for at, e in self.events if e["type"] == m.TOKEN), None)

    def text(self) -> str | None:
        done = [e for _, e in self.events if e["type"] == m.DONE]
        return done[0].get("text") if done else None

    def finish(self) -> None:
        self.join(WAIT_S * 5)
        if self.error is not None or self.is_alive():
            raise RuntimeError(f"background job failed: {self.error or 'no end'}")


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def measure_runtime(rt: BenchRuntime, *, prompt: str, reps: int, log: Log) -> dict[str, Any]:
    with rt.client() as client:
        _chat_once(client)  # warm-up
        idle = [_chat_once(client)[0] for _ in range(reps)]
        log(f"  idle chat TTFT p50 {_median(idle):.3f} s")
        solo = _Job(rt, prompt, 4)
        solo.start()
        solo.finish()
        first = solo.first_token_at()
        if first is None:
            raise RuntimeError("the background job streamed nothing")
        prefill_solo = first - solo.sent
        log(f"  background prefill alone {prefill_solo:.2f} s")
        in_prefill: list[float] = []
        inside, same = 0, True
        for rep in range(reps):
            bg = _Job(rt, prompt, 4)
            bg.start()
            if not bg.started.wait(WAIT_S):
                raise RuntimeError("the background job never started")
            time.sleep(SHARES[rep % len(SHARES)] * prefill_solo)
            sent = time.monotonic()
            ttft, _ = _chat_once(client)
            in_prefill.append(ttft)
            bg.finish()
            bg_first = bg.first_token_at()
            inside += int(bg_first is not None and bg_first > sent + ttft)
            same = same and bg.text() == solo.text()
        log(f"  chat TTFT during a background prefill p50 {_median(in_prefill):.3f} s "
            f"({inside}/{reps} inside the prefill)")
        in_decode: list[float] = []
        for _ in range(reps):
            bg = _Job(rt, BG_PROMPT, 200)
            bg.start()
            if not bg.streaming.wait(WAIT_S):
                raise RuntimeError("the background job never streamed")
            in_decode.append(_chat_once(client)[0])
            bg.finish()
        log(f"  chat TTFT during a background decode p50 {_median(in_decode):.3f} s")
    idle_p50 = _median(idle)
    return {
        "ttft_idle_s": idle_p50, "ttft_bg_prefill_s": _median(in_prefill),
        "ttft_bg_decode_s": _median(in_decode), "bg_prefill_solo_s": prefill_solo,
        "chat_inside_prefill": inside, "bg_text_same": same,
        "ratios": {"bg_prefill_over_idle": (_median(in_prefill) or 0) / idle_p50
                   if idle_p50 else None,
                   "bg_decode_over_idle": (_median(in_decode) or 0) / idle_p50
                   if idle_p50 else None},
        "samples": {"ttft_idle_s": idle, "ttft_bg_prefill_s": in_prefill,
                    "ttft_bg_decode_s": in_decode},
    }


def run(*, model: str, reps: int = 5, prompt_tokens: int = 1700, snapshot_tokens: int = 2000,
        variants: tuple[str, ...] = ("bounded", "fixed_64"), in_process: bool = True,
        home: Path | None = None, log: Log = lambda _m: None) -> dict[str, Any]:
    """The whole bench (see the module docstring); returns the result map."""
    model_dir = ensure_model(model, ModelStore(models_dir()))
    prompt = long_text(load_tokenizer(model_dir), prompt_tokens)
    base = home or Path(tempfile.mkdtemp(prefix="uniun-bench-bounded-", dir="/tmp"))
    result: dict[str, Any] = {"model": model, "reps": reps, "prompt_tokens": prompt_tokens,
                              "cpus": os.cpu_count(),
                              "when": time.strftime("%Y-%m-%d %H:%M:%S"), "runtimes": {}}
    for name in variants:
        with BenchRuntime(base / name, policy="uniun", model=model, log=log,
                          extra_config=VARIANTS[name]) as rt:
            log(f"runtime {name}")
            result["runtimes"][name] = measure_runtime(rt, prompt=prompt, reps=reps, log=log)
    if in_process:
        result.update(run_session(model_dir, prompt_tokens=prompt_tokens,
                                  snapshot_tokens=snapshot_tokens, reps=max(1, min(reps, 3)),
                                  log=log))
    return result
