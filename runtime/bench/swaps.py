"""The swap benchmark: the shipped multi-model trace replayed on the real mesh.

``examples/traces/multi_model.jsonl`` (15 minutes: chats and extraction on the chat
model, Nataraj cards, two Ganas on their own models) is replayed against a real
runtime per policy (``uniun``, ``fcfs``) with two real decoders: the chat model
(SmolLM2-135M) and Gemma 3 270M, which stands in for the trace's other models
(``--map``). Each trace job becomes a real job: a filler prompt of about its
``prompt_tokens`` (raw text; Gemma is a base model), ``max_new_tokens`` = its
``new_tokens``, both times ``token_scale``; its deadline kept relative to its submit.
Only the first ``window_s`` seconds of the trace are replayed (at trace speed), then
the benchmark waits for the submitted jobs to finish (``drain_s`` at most).

Reported per policy:

- ``swaps``: the policy's swap count (the scheduler's ``status``), and
  ``swap_seconds_total`` / ``swap_seconds_mean``: the runner's own load times of those
  swaps (its log lines ``model X loaded in S s``, the boot preload excluded);
- ``chat_ttft_cold_s`` (client-side, submit -> first token) of the chats sent while the
  loaded model was not the chat model (the scheduler's ``loaded_model``, polled every
  0.2 s), and ``chat_ttft_warm_s`` of the others, with counts and medians;
- ``finished`` / ``submitted`` and the wall time.

The runtimes run with the default heartbeat rule. Loading Gemma's tokenizer (262,144
pieces, 513,511 merges) holds the GIL for seconds of CPU in ``tokenizers``, so no runner
thread can beat meanwhile; the runner announces each load's silence first
(``supervisor.load_grace_s``, docs/runtime.md). ``runner_restarts`` counts any restart
that still happened: it should be 0.

Why a window and a token scale: the trace is sized so a phone's runner is slightly
over-loaded; at trace speed on the machine class the project targets a full replay would
take many minutes per policy and never drain. The window keeps the trace's order,
spacing and model mix.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from uniun.protocol import messages as m
from uniun.runtime.bench.e2e import WAIT_S, BenchRuntime, Log

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "examples" / "traces" / "multi_model.jsonl"
DEFAULT_MAP = {"qwen2.5-0.5b-instruct": "gemma3-270m", "phi-3-mini": "gemma3-270m"}
_FILLER = ("The quick brown fox jumps over the lazy dog while the river runs past the old "
           "mill and the bells of the town ring out across the fields of wheat. ")
_LOADED = re.compile(r"model (\S+) loaded in ([0-9.]+) s")


def filler(tokens: int) -> str:
    """Plain English text of about ``tokens`` tokens (~1 token per word here)."""
    words = (_FILLER * (tokens // 20 + 2)).split()
    return " ".join(words[:max(1, tokens)])


def trace_jobs(path: Path, *, window_s: float, token_scale: float, chat_model: str,
               model_map: dict[str, str]) -> list[tuple[float, dict[str, Any]]]:
    """(trace time, wire job) of each submit in the first ``window_s`` seconds."""
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        if event["event"] != "submit" or event["t"] >= window_s:
            continue
        raw = event["job"]
        model = model_map.get(raw.get("model_id") or chat_model, raw.get("model_id")
                              or chat_model)
        job: dict[str, Any] = {
            "job_id": f"{raw['job_id']}-{uuid.uuid4().hex[:6]}", "kind": raw["kind"],
            "model_id": model,
            "max_new_tokens": max(1, round(raw["new_tokens"] * token_scale))}
        prompt = filler(max(4, round(raw["prompt_tokens"] * token_scale)))
        if raw["kind"] == "chat":
            job["messages"] = [{"role": "user", "content": prompt}]
        else:
            job["prompt"] = prompt
        if raw.get("flow"):
            job["flow"] = raw["flow"]
        if raw.get("deadline") is not None:
            job["deadline_after_s"] = float(raw["deadline"]) - float(event["t"])
        out.append((float(event["t"]), job))
    return out


class _Job(threading.Thread):
    """One job on its own client: submit at its time, timestamp the first token."""

    def __init__(self, rt: BenchRuntime, job: dict[str, Any], loaded: _Poller) -> None:
        super().__init__(daemon=True)
        self.rt, self.job, self.loaded = rt, dict(job), loaded
        self.sent = 0.0
        self.model_at_submit: str | None = None
        self.ttft: float | None = None
        self.done = False
        self.error: str | None = None

    def run(self) -> None:
        after = self.job.pop("deadline_after_s", None)
        if after is not None:
            self.job["deadline"] = time.time() + after
        try:
            with self.rt.client() as client:
                self.model_at_submit = self.loaded.model
                self.sent = time.monotonic()
                for event in client.submit(self.job):
                    if event["type"] == m.TOKEN and self.ttft is None:
                        self.ttft = time.monotonic() - self.sent
                    elif event["type"] == m.DONE:
                        self.done = True
                    elif event["type"] == m.ERROR:
                        self.error = str(event.get("code"))
        except Exception as err:  # noqa: BLE001 - recorded, the replay goes on
            self.error = f"{type(err).__name__}: {err}"


class _Poller(threading.Thread):
    """The scheduler's ``loaded_model``, every 0.2 s."""

    def __init__(self, rt: BenchRuntime) -> None:
        super().__init__(daemon=True)
        self.rt = rt
        self.model: str | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        with self.rt.client() as client:
            while not self.stop.is_set():
                with contextlib.suppress(Exception):  # a slow reply: keep the last value
                    self.model = client.status(timeout=10.0).get("loaded_model")
                self.stop.wait(0.2)


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def _swap_loads(rt: BenchRuntime) -> list[float]:
    """Load times the runner logged, less the first (the boot preload of the chat model,
    which may be logged after the runtime answers pings)."""
    path = rt.home / "logs" / "runner.log"
    lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    return [float(mt.group(2)) for line in lines if (mt := _LOADED.search(line))][1:]


def replay(rt: BenchRuntime, jobs: list[tuple[float, dict[str, Any]]], *, chat_model: str,
           drain_s: float, log: Log) -> dict[str, Any]:
    """Replay ``jobs`` at trace speed on ``rt``; the figures of the module doc."""
    poller = _Poller(rt)
    poller.start()
    with rt.client() as client:
        swaps_before = int(client.status(timeout=WAIT_S).get("swaps", 0))
    threads: list[_Job] = []
    start = time.monotonic()
    for t, job in jobs:
        delay = start + t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        thread = _Job(rt, job, poller)
        thread.start()
        threads.append(thread)
    submitted_s = time.monotonic() - start
    for thread in threads:
        thread.join(max(0.0, start + submitted_s + drain_s - time.monotonic()))
    wall = time.monotonic() - start
    poller.stop.set()
    with rt.client() as client:
        status = client.status(timeout=WAIT_S)
        for thread in threads:  # the drain ran out: cancel what is left
            if thread.is_alive():
                with contextlib.suppress(Exception):  # ended meanwhile, or no answer
                    client.cancel(thread.job["job_id"], timeout=WAIT_S)
    time.sleep(2.0)  # a swap dispatched last is logged when its load ends
    loads = _swap_loads(rt)
    sup = rt.home / "logs" / "supervisor.log"
    restarts = (sup.read_text(errors="replace").count("restarting runner")
                if sup.is_file() else 0)
    chats = [t for t in threads if t.job["kind"] == "chat"]
    cold = [t.ttft for t in chats if t.ttft is not None and t.model_at_submit != chat_model]
    warm = [t.ttft for t in chats if t.ttft is not None and t.model_at_submit == chat_model]
    result: dict[str, Any] = {
        "submitted": len(threads), "finished": sum(t.done for t in threads),
        "errors": sorted({t.error for t in threads if t.error}),
        "wall_s": round(wall, 1),
        "swaps": int(status.get("swaps", 0)) - swaps_before,
        "swap_loads_logged": len(loads), "runner_restarts": restarts,
        "swap_seconds_total": round(sum(loads), 2),
        "swap_seconds_mean": round(sum(loads) / len(loads), 3) if loads else None,
        "chat_ttft_cold_s": {"n": len(cold), "p50": _median(cold),
                             "max": round(max(cold), 3) if cold else None},
        "chat_ttft_warm_s": {"n": len(warm), "p50": _median(warm),
                             "max": round(max(warm), 3) if warm else None},
        "chats_without_first_token": sum(t.ttft is None for t in chats),
    }
    log(f"  {result['finished']}/{result['submitted']} finished in {result['wall_s']} s; "
        f"{result['swaps']} swaps, {result['swap_seconds_total']} s loading; chat TTFT cold "
        f"p50 {result['chat_ttft_cold_s']['p50']} s (n={len(cold)}), warm p50 "
        f"{result['chat_ttft_warm_s']['p50']} s (n={len(warm)})")
    return result


def run(*, chat_model: str, policies: tuple[str, ...], trace: Path, window_s: float,
        token_scale: float, drain_s: float, home: Path, model_map: dict[str, str],
        log: Log) -> dict[str, Any]:
    """Replay the trace under each policy, each in a fresh runtime over ``home``."""
    jobs = trace_jobs(trace, window_s=window_s, token_scale=token_scale,
                      chat_model=chat_model, model_map=model_map)
    models = sorted({j["model_id"] for _, j in jobs})
    log(f"replaying {len(jobs)} jobs of {trace.name} (first {window_s:.0f} s, tokens x "
        f"{token_scale}) on {', '.join(models)}")
    out: dict[str, Any] = {"trace": str(trace), "window_s": window_s,
                           "token_scale": token_scale, "models": models,
                           "model_map": model_map, "jobs": len(jobs), "policies": {}}
    for policy in policies:
        with BenchRuntime(home / policy, policy=policy, model=chat_model, log=log) as rt:
            out["policies"][policy] = replay(rt, jobs, chat_model=chat_model,
                                             drain_s=drain_s, log=log)
    loads = [s for p in out["policies"].values() for s in [p["swap_seconds_mean"]] if s]
    out["measured_swap_s"] = round(statistics.median(loads), 3) if loads else None
    return out
