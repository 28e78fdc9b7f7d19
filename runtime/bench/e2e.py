"""The end-to-end benchmark: a real runtime, real sockets, the real model.

What it measures (docs/design.md §7), for each policy (``uniun`` and the ``fcfs`` baseline),
each figure the median over ``reps`` repetitions:

- ``http``: chat TTFT idle over the HTTP gateway against the ZeroMQ front, interleaved in
  the first policy's runtime (``runtime/bench/http.py``); ``ratios.http_over_zmq_idle``.
- ``constrained``: the grammar mask's cost per token against the rest of a decode step.
- ``ttft_idle_s``: chat time to first token with nothing else running, seen by the
  client (submit sent -> first ``token`` received); ``server_ttft_idle_s`` is the
  scheduler's own ``timings.ttft_s``.
- ``ttft_loaded_s``: the same while a background job (``nataraj``, ``bg_tokens`` greedy
  tokens) is generating: the chat is sent once the background job has streamed a few
  tokens.
- ``chat_to_paused_s``: chat sent -> the background job's ``paused`` event received
  (uniun only; fcfs never pauses).
- ``bg_every_token``: every background job finished ``done`` with gap-free ``seq``
  0..n-1, n = ``usage.completion_tokens``, and the streamed text equal to ``done.text``.
- ``runner_restart``: after SIGKILL of the runner, seconds until the supervisor shows a
  new runner up (``up_s``) and until a chat sent right after the kill gets its first
  token (``serving_s``; a ``runner_failed`` answer is retried, as a user would).

It also calls the model room's ``models.bench.run_bench`` (decode ms/token, prefill, ...)
and a policy decision-time measurement (10,000 queued jobs). Each runtime is started with
``uniun-runtime start`` in a temporary home (the shared model store is used), so the
benchmark never touches a running runtime.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniun.models.convert.recipes import ensure_model
from uniun.models.store import ModelStore
from uniun.protocol import messages as m
from uniun.protocol.client import Client, JobFailed
from uniun.runtime.bench.http import constrained_cost, measure_http
from uniun.runtime.config_sections import SupervisorConfig
from uniun.runtime.paths import MODELS_ENV, models_dir
from uniun.runtime.state import read_state

Log = Callable[[str], None]
CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
BG_PROMPT = ("Write a long, detailed story about a lighthouse keeper who finds a message "
             "in a bottle. Describe the sea, the weather and every day of the week.")
WAIT_S = 180.0  # seconds; generous: a loaded small machine is slow


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


class BenchRuntime:
    """``uniun-runtime start`` in a subprocess over ``home``; stopped on exit."""

    def __init__(self, home: Path, *, policy: str, model: str, log: Log,
                 extra_config: str = "") -> None:
        self.home, self.policy, self.model, self.log = home, policy, model, log
        self.extra_config = extra_config  # more TOML sections (the overhead bench's)
        self.env = dict(os.environ, UNIUN_HOME=str(home))
        # The caller's model store, not one under the temporary home: a bench must not
        # time a pull and a conversion as a swap or a start (docs/models.md, bench-swaps).
        self.env.setdefault(MODELS_ENV, str(models_dir()))
        self.env.pop("UNIUN_CONFIG", None)
        self.config = home / "bench.toml"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> BenchRuntime:
        self.home.mkdir(parents=True, exist_ok=True)
        self.config.write_text(f'[models]\nchat_model = "{self.model}"\n'
                               f'[policy]\nname = "{self.policy}"\n'
                               '[producers]\nextract = false\nnataraj = false\n'
                               'gana = false\nbackground_gana = false\n'
                               '[embed]\nenabled = false\n'  # measured load only
                               '[http]\nport = 0\n'  # a free port: the HTTP TTFT
                               + self.extra_config)
        self.log(f"starting runtime (policy {self.policy}, model {self.model}) in {self.home}")
        out = open(self.home / "start.out", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "uniun.runtime", "start",
                                      "--config", str(self.config)],
                                     env=self.env, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        deadline = time.monotonic() + WAIT_S * 3  # the first start may convert the model
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the runtime exited during start; see {self.home}/start.out")
            state = read_state(self.run_dir) or {}
            if state.get("state") == "running" and state.get("pid") == self.proc.pid:
                with self.client() as client:
                    client.ping(timeout=WAIT_S)
                return self
            time.sleep(0.2)
        raise RuntimeError(f"the runtime did not come up; see {self.home}/logs")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    def client(self) -> Client:
        return Client(f"ipc://{self.run_dir / 'front.sock'}", timeout=WAIT_S)


def _chat_once(client: Client, max_new_tokens: int = 8) -> tuple[float, float | None]:
    """(client-side TTFT, server ttft_s) of one short chat."""
    sent = time.monotonic()
    stream = client.submit({"job_id": f"bench-chat-{uuid.uuid4().hex[:10]}", "kind": "chat",
                            "messages": CHAT, "max_new_tokens": max_new_tokens})
    first: float | None = None
    for event in stream:
        if event["type"] == m.TOKEN and first is None:
            first = time.monotonic() - sent
        elif event["type"] == m.ERROR:
            raise JobFailed.from_msg(event)
    done = stream.final or {}
    return (first if first is not None else float("nan"),
            (done.get("timings") or {}).get("ttft_s"))


class _Background(threading.Thread):
    """Submits one background job on its own client and timestamps every event."""

    def __init__(self, rt: BenchRuntime, tokens: int) -> None:
        super().__init__(daemon=True)
        self.rt, self.tokens = rt, tokens
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.streaming = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.rt.client() as client:
                stream = client.submit({"job_id": f"bench-bg-{uuid.uuid4().hex[:10]}",
                                        "kind": "nataraj", "prompt": BG_PROMPT,
                                        "max_new_tokens": self.tokens})
                for event in stream:
                    self.events.append((time.monotonic(), event))
                    if event["type"] == m.TOKEN and event["seq"] >= 4:
                        self.streaming.set()
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            self.error = err
        finally:
            self.streaming.set()

    def complete(self) -> bool:
        """Done, with every token streamed once, in order, matching ``done.text``."""
        tokens = [e for _, e in self.events if e["type"] == m.TOKEN]
        done = [e for _, e in self.events if e["type"] == m.DONE]
        if self.error is not None or len(done) != 1:
            return False
        usage = done[0].get("usage") or {}
        return ([t["seq"] for t in tokens] == list(range(len(tokens)))
                and len(tokens) == usage.get("completion_tokens")
                and "".join(t["text"] for t in tokens) == done[0].get("text"))

    def first_pause_after(self, t: float) -> float | None:
        for at, event in self.events:
            if at >= t and event["type"] == m.PAUSED:
                return at - t
        return None


def measure_policy(rt: BenchRuntime, *, reps: int, bg_tokens: int, log: Log) -> dict[str, Any]:
    with rt.client() as client:
        _chat_once(client)  # warm-up: sessions, caches, first allocations
        idle = [_chat_once(client) for _ in range(reps)]
        log(f"  idle chat TTFT p50 {median([c for c, _ in idle]):.3f} s")
        runner_model = client.status(timeout=WAIT_S).get("loaded_model")  # what it measured
        loaded: list[tuple[float, float | None]] = []
        paused: list[float] = []
        complete: list[bool] = []
        for _ in range(reps):
            bg = _Background(rt, bg_tokens)
            bg.start()
            if not bg.streaming.wait(WAIT_S):
                raise RuntimeError("the background job never started streaming")
            sent = time.monotonic()
            loaded.append(_chat_once(client))
            bg.join(WAIT_S)
            if bg.error is not None:
                raise RuntimeError(f"background job failed: {bg.error}")
            pause = bg.first_pause_after(sent)
            if pause is not None:
                paused.append(pause)
            complete.append(bg.complete())
        log(f"  loaded chat TTFT p50 {median([c for c, _ in loaded]):.3f} s; "
            f"background complete {sum(complete)}/{len(complete)}")
    return {
        "runner_model": runner_model,
        "ttft_idle_s": median([c for c, _ in idle]),
        "server_ttft_idle_s": median([s for _, s in idle if s is not None]),
        "ttft_loaded_s": median([c for c, _ in loaded]),
        "server_ttft_loaded_s": median([s for _, s in loaded if s is not None]),
        "chat_to_paused_s": median(paused),
        "paused_seen": len(paused),
        "bg_every_token": all(complete),
        "bg_jobs": len(complete),
        "samples": {"ttft_idle_s": [c for c, _ in idle],
                    "ttft_loaded_s": [c for c, _ in loaded],
                    "chat_to_paused_s": paused},
    }


def measure_restart(rt: BenchRuntime, *, reps: int, log: Log) -> dict[str, Any]:
    """SIGKILL the runner ``reps`` times, each after a healthy period; seconds until it is
    up and until chat answers."""
    ups: list[float] = []
    serving: list[float] = []
    for _ in range(reps):
        old = (read_state(rt.run_dir) or {}).get("children", {}).get("runner")
        if not isinstance(old, int):
            raise RuntimeError("no runner pid in the supervisor state")
        t0 = time.monotonic()
        os.kill(old, signal.SIGKILL)
        watcher = threading.Thread(target=_record_runner_up, args=(rt, old, t0, ups),
                                   daemon=True)
        watcher.start()
        with rt.client() as client:
            while True:
                try:
                    _chat_once(client)
                    serving.append(time.monotonic() - t0)
                    break
                except JobFailed as err:
                    if not err.retryable or time.monotonic() - t0 > WAIT_S:
                        raise
        watcher.join(WAIT_S)
        log(f"  runner restart: serving again after {serving[-1]:.2f} s")
        # The goal is for a kill after a healthy period: a runner killed sooner counts
        # as a crash loop and is rightly restarted after a back-off.
        time.sleep(SupervisorConfig().healthy_after_s + 1.0)
    return {"serving_s": median(serving), "up_s": median(ups),
            "samples": {"serving_s": serving}}


def _record_runner_up(rt: BenchRuntime, old: int, t0: float, ups: list[float]) -> None:
    """The watcher thread's body: append :func:`_runner_up` to ``ups``."""
    ups.append(_runner_up(rt, old, t0))


def _runner_up(rt: BenchRuntime, old: int, t0: float) -> float:
    """Seconds from ``t0`` until the supervisor reports a new runner up (heartbeating)."""
    while time.monotonic() - t0 < WAIT_S:
        state = read_state(rt.run_dir) or {}
        pid = (state.get("children") or {}).get("runner")
        if pid not in (None, old) and (state.get("up") or {}).get("runner"):
            return time.monotonic() - t0
        time.sleep(0.01)
    return float("nan")


def model_bench(model: str, *, reps: int, log: Log) -> dict[str, Any] | None:
    """The model room's session benchmark, if it is there."""
    try:
        from uniun.models.bench import run_bench
    except ImportError:
        return None
    log(f"model bench ({model})")
    return dict(run_bench(ensure_model(model, ModelStore(models_dir())), threads=2, reps=reps,
                          log=lambda msg: log(f"  {msg}")))


def policy_decision_bench(*, queued: int = 10_000, rounds: int = 500) -> dict[str, Any]:
    """The policy room's decision-time benchmark (``actors/sim/policy_bench.py``)."""
    from uniun.actors.sim.policy_bench import run_bench

    return run_bench(jobs=queued, rounds=rounds)


def embed_bench(*, log: Log) -> dict[str, Any] | None:
    """Embedding throughput of a real pool of 2 (``runtime/bench/embedding.py``)."""
    from uniun.models.store import ModelNotFound, ModelStoreError
    from uniun.runtime.bench.embedding import run as run_embed

    log("embedding pool bench (pool of 2)")
    try:
        with tempfile.TemporaryDirectory(prefix="uniun-eb-out-") as out:
            return run_embed(Path(out))
    except (ModelNotFound, ModelStoreError, RuntimeError) as err:
        log(f"  embedding bench skipped: {err}")
        return {"error": str(err)}


def run(*, model: str, policies: tuple[str, ...] = ("uniun", "fcfs"), reps: int = 5,
        bg_tokens: int = 200, home: Path | None = None, restart_reps: int = 3,
        with_model_bench: bool = True, log: Log = lambda _m: None) -> dict[str, Any]:
    """Run the whole benchmark and return the result map (see the module docstring)."""
    base = home or Path(tempfile.mkdtemp(prefix="uniun-bench-", dir="/tmp"))
    result: dict[str, Any] = {"model": model, "reps": reps, "bg_tokens": bg_tokens,
                              "cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%d %H:%M:%S"),
                              "policies": {}}
    for name in policies:
        with BenchRuntime(base / name, policy=name, model=model, log=log) as rt:
            result["policies"][name] = measure_policy(rt, reps=reps, bg_tokens=bg_tokens,
                                                      log=log)
            if name == policies[0]:
                result["http"] = measure_http(rt.run_dir, f"ipc://{rt.run_dir / 'front.sock'}",
                                              model, reps=reps, log=log)
            if name == policies[0] and restart_reps > 0:
                result["runner_restart"] = measure_restart(rt, reps=restart_reps, log=log)
    pol = result["policies"]
    uni, fcfs = pol.get("uniun", {}), pol.get("fcfs", {})
    result["ratios"] = {
        "uniun_loaded_over_idle": _ratio(uni.get("ttft_loaded_s"), uni.get("ttft_idle_s")),
        "fcfs_over_uniun_loaded": _ratio(fcfs.get("ttft_loaded_s"), uni.get("ttft_loaded_s")),
        "http_over_zmq_idle": (result.get("http") or {}).get("http_over_zmq"),
    }
    result["policy_decision"] = policy_decision_bench()
    if with_model_bench:
        result["model_bench"] = model_bench(model, reps=3, log=log)
        result["embed_bench"] = embed_bench(log=log)
        log("constrained decoding cost (extraction schema)")
        result["constrained"] = constrained_cost(ensure_model(model, ModelStore(models_dir())),
                                                 log=log)
    return result


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None
