"""Benchmark: the device speaks for itself (docs/device.md, "Power and heat").

``uniun-runtime bench --device [--seconds S] [--out FILE]``
(``python -m uniun.runtime.bench.device`` does the same).

One runtime (scheduler and runner; producers and pool off) reads a fake sysfs tree
(``[device] sysfs_root``) that the bench rewrites: on the charger, on battery at 60 % and
at 15 %, warm (a passive trip point reached) and critical. In each state a raw client
keeps long background (``gana``) jobs queued for ``S`` seconds and counts what they got:
tokens, and runner-seconds as the scheduler recorded them (the timeline's run segments
in ``journal.db``; the stretches between two tokens less than 0.5 s apart, seen by the
client, are beside them as ``token_stretches_s``). Against that it checks the governor: 15 % gets
at most 5 % of the charger's tokens; 60 % and warm get their share of the time (the
bucket's ``power_burst_s`` plus ``share * S``) within 10 %; critical gets none. A few
chats in each state give the chat TTFT against chats on the charger with nothing else
running. Then the embedding pool, started alone like the supervisor starts it: its
ready time and one request's latency beside two nice-0 busy loops, against quiet. And
the power watch's own CPU, per hour at its default poll (5 s), on the fake tree and on
this machine's ``/sys``.

Shorter states than a minute are fine: every figure is scaled to what the state's
length predicts, and the JSON says the length used.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from uniun.actors.policy import PolicyConfig
from uniun.actors.scheduler.power_reader import PowerWatch
from uniun.runtime.bench.burst import RawClient
from uniun.runtime.bench.device_embed import embed_with_and_without_hog
from uniun.runtime.bench.fake_sysfs import write_power, write_thermal
from uniun.runtime.bench.launch import launched
from uniun.runtime.config import DEFAULT_CHAT_MODEL

DEFAULT_OUT = Path("bench/results") / "device-power.json"
CONFIG = ('[models]\nchat_model = "{model}"\n'
          "[producers]\nextract = false\nnataraj = false\ngana = false\n"
          "background_gana = false\n[embed]\nenabled = false\n[http]\nport = 0\n"
          '[device]\nsysfs_root = "{sysfs}"\npower_poll_s = 0.5\n')
WAIT_S = 300.0
RUN_GAP_S = 0.5  # two background tokens closer than this: the job held the runner between
# (state, battery percent or None, charging, temperature °C, the mode the governor says)
STATES = (("charger", 80, True, 45.0, "normal"),
          ("battery_60", 60, False, 45.0, "budget"),
          ("battery_15", 15, False, 45.0, "deadline_only"),
          ("warm", 80, True, 85.0, "duty"),
          ("critical", 80, True, 110.0, "paused"))
BG_PROMPT = "Write a long, detailed story about the sea, the tides and the moon."


class _Session:
    """The raw client, the background jobs it keeps queued, and what came back."""

    def __init__(self, client: RawClient, model: str) -> None:
        self.client, self.model = client, model
        self.bg_tokens: list[float] = []  # arrival times of background tokens
        self.bg_live: set[str] = set()
        self.chat_first: dict[str, float] = {}
        self.chat_done: set[str] = set()
        self.status: dict[str, Any] | None = None

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            msg = self.client.recv(min(left, 0.2))
            if msg is None:
                continue
            kind, job_id = msg.get("type"), msg.get("job_id")
            if kind == "status":
                self.status = msg
            elif kind == "token":
                if job_id in self.bg_live:
                    self.bg_tokens.append(time.monotonic())
                elif isinstance(job_id, str) and job_id not in self.chat_first:
                    self.chat_first[job_id] = time.monotonic()
            elif kind in ("done", "error") and job_id:
                self.bg_live.discard(job_id)
                self.chat_done.add(job_id)

    def ask_status(self) -> dict[str, Any]:
        self.status = None
        self.client.send("status")
        deadline = time.monotonic() + WAIT_S
        while self.status is None and time.monotonic() < deadline:
            self.pump(0.1)
        if self.status is None:
            raise RuntimeError("the scheduler did not answer status")
        return self.status

    def keep_background(self, queued: int = 2) -> None:
        while len(self.bg_live) < queued:
            job_id = f"bg-{uuid.uuid4().hex[:8]}"
            self.bg_live.add(job_id)
            self.client.send("submit", job={"job_id": job_id, "kind": "gana",
                                            "model_id": self.model, "prompt": BG_PROMPT,
                                            "max_new_tokens": 4096})

    def chat_ttft(self) -> float:
        job_id = f"chat-{uuid.uuid4().hex[:8]}"
        sent = time.monotonic()
        self.client.send("submit", job={"job_id": job_id, "kind": "chat",
                                        "model_id": self.model, "max_new_tokens": 4,
                                        "messages": [{"role": "user", "content": "Say hi."}]})
        deadline = sent + WAIT_S
        while job_id not in self.chat_done and time.monotonic() < deadline:
            self.pump(0.05)
        if job_id not in self.chat_first:
            raise RuntimeError(f"chat {job_id} streamed no token")
        return self.chat_first[job_id] - sent

    def cancel_background(self) -> None:
        for job_id in list(self.bg_live):
            self.client.send("cancel", job_id=job_id)
        deadline = time.monotonic() + WAIT_S
        while self.bg_live and time.monotonic() < deadline:
            self.pump(0.1)


def _runner_seconds(times: list[float]) -> float:
    return sum(b - a for a, b in itertools.pairwise(times) if b - a < RUN_GAP_S)


def _journal_runner_s(home: Path, start: float, end: float) -> float:
    """Runner-seconds of background jobs between two unix times, as the scheduler
    recorded them (the timeline's run segments in ``journal.db``, read-only)."""
    uri = f"file:{home / 'journal.db'}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as db:
        rows = db.execute("SELECT start, end FROM segments WHERE lane = 'run' AND "
                          "kind != 'chat' AND end > ? AND start < ?", (start, end)).fetchall()
    return sum(min(b, end) - max(a, start) for a, b in rows)


def _set_state(sysfs: Path, battery: int | None, charging: bool, temp_c: float) -> None:
    write_power(sysfs, battery=battery, charging=charging)
    write_thermal(sysfs, temp_c=temp_c)


def _measure_state(s: _Session, seconds: float, chats: int) -> dict[str, Any]:
    s.bg_tokens.clear()
    start = time.monotonic()
    wall_start = time.time()
    ttfts: list[float] = []
    gap = seconds / (chats + 1)
    for _ in range(chats):
        s.keep_background()
        s.pump(gap)
        ttfts.append(s.chat_ttft())
    while time.monotonic() - start < seconds:
        s.keep_background()
        s.pump(min(1.0, seconds - (time.monotonic() - start)))
    return {"tokens": len(s.bg_tokens),
            "token_stretches_s": round(_runner_seconds(s.bg_tokens), 2),
            "wall": (wall_start, time.time()),
            "chat_ttft_s": ttfts, "chat_ttft_median_s": statistics.median(ttfts)}


def measure_power(model: str, seconds: float, chats: int,
                  log: Callable[[str], None]) -> dict[str, Any]:
    cfg = PolicyConfig()
    with tempfile.TemporaryDirectory(prefix="uniun-bench-dev-", dir="/tmp") as tmp:
        home, sysfs = Path(tmp) / "home", Path(tmp) / "sys"
        home.mkdir()
        _set_state(sysfs, 80, True, 45.0)
        with launched(home, CONFIG.format(model=model, sysfs=sysfs)) as proc, closing(
                RawClient(f"ipc://{home / 'run' / 'front.sock'}")) as client:
            s = _Session(client, model)
            deadline = time.monotonic() + WAIT_S
            while not s.ask_status().get("ready"):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"the runtime did not become ready ({home}/start.out)")
                time.sleep(0.5)
            idle = [s.chat_ttft() for _ in range(max(3, chats))]
            result: dict[str, Any] = {"idle_charger_chat_ttft_median_s":
                                      statistics.median(idle), "states": {}}
            log(f"device: idle chat TTFT on the charger {statistics.median(idle):.3f}s")
            for name, battery, charging, temp, mode in STATES:
                _set_state(sysfs, battery, charging, temp)
                while (s.ask_status().get("power") or {}).get("mode") != mode:
                    s.pump(0.2)
                    if time.monotonic() > deadline + WAIT_S:
                        raise RuntimeError(f"the governor never reached {mode}")
                power = dict(s.ask_status()["power"])
                row = _measure_state(s, seconds, chats)
                row["saved_s_at_end"] = (s.ask_status().get("power") or {}).get("saved_s")
                s.cancel_background()  # their run segments are in the journal after this
                row["runner_s"] = round(_journal_runner_s(home, *row.pop("wall")), 2)
                share = power.get("background_share")
                if mode in ("budget", "duty") and share is not None:
                    row["expected_runner_s"] = round(cfg.power_burst_s + share * seconds, 2)
                row.update(mode=mode, power=power)
                row["chat_ttft_vs_idle"] = row["chat_ttft_median_s"] / result[
                    "idle_charger_chat_ttft_median_s"]
                result["states"][name] = row
                log(f"device: {name}: {row['tokens']} background tokens, "
                    f"{row['runner_s']} runner-s (expected {row.get('expected_runner_s')}), "
                    f"chat TTFT x{row['chat_ttft_vs_idle']:.2f}")
            events = [e for e in s.ask_status().get("events", []) if e["what"] == "power"]
            result["power_marks"] = len(events)
    st = result["states"]
    charger = st["charger"]["tokens"] or 1
    result["goals"] = {
        "battery_15_tokens_vs_charger": st["battery_15"]["tokens"] / charger,
        "battery_60_runner_s_vs_budget": (st["battery_60"]["runner_s"]
                                         / st["battery_60"]["expected_runner_s"]),
        "warm_runner_s_vs_duty": st["warm"]["runner_s"] / st["warm"]["expected_runner_s"],
        # What was allowed but not used is still in the bucket at the end (at most
        # power_resume_s: a job starts only once that much is saved).
        "battery_60_used_plus_saved_vs_budget": _used_plus_saved(st["battery_60"]),
        "warm_used_plus_saved_vs_duty": _used_plus_saved(st["warm"]),
        "critical_tokens": st["critical"]["tokens"],
        "chat_ttft_vs_idle_worst": max(r["chat_ttft_vs_idle"] for r in st.values()),
    }
    return result


def _used_plus_saved(row: dict[str, Any]) -> float:
    return (row["runner_s"] + max(0.0, row.get("saved_s_at_end") or 0.0)) / row[
        "expected_runner_s"]


def measure_watch(polls: int = 400) -> dict[str, Any]:
    """The power watch's CPU per read, and per hour at the default 5 s poll."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="uniun-bench-watch-") as tmp:
        _set_state(Path(tmp), 60, False, 45.0)
        for name, root in (("fake_tree", Path(tmp)), ("this_machine_sys", Path("/sys"))):
            watch = PowerWatch(root, lambda _state: None, poll_s=5.0)
            for _ in range(polls):
                watch.poll()
            per_read = watch.cpu_s / polls
            out[name] = {"cpu_ms_per_read": round(per_read * 1000, 4),
                         "cpu_s_per_hour_at_5s": round(per_read * 3600 / 5.0, 4),
                         "state": watch.last.as_dict() if watch.last else None}
    return out


def run(model: str, seconds: float, chats: int, log: Callable[[str], None],
        embed: bool = True) -> dict[str, Any]:
    result: dict[str, Any] = {"model": model, "state_seconds": seconds,
                              "note": "state lengths shorter than 60 s: expected figures "
                                      "are scaled to the length used"}
    result["watch"] = measure_watch()
    log(f"device: watch {result['watch']}")
    result["power"] = measure_power(model, seconds, chats, log)
    if embed:
        result["embedding_hog"] = embed_with_and_without_hog(log)
    with contextlib.suppress(OSError):
        result["load_avg"] = list(os.getloadavg())
    result["host"] = subprocess.run(["uname", "-srm"], capture_output=True,
                                    text=True).stdout.strip()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uniun.runtime.bench.device")
    parser.add_argument("--model", default=DEFAULT_CHAT_MODEL)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--chats", type=int, default=3)
    parser.add_argument("--no-embed", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    result = run(args.model, args.seconds, args.chats,
                 lambda msg: print(msg, file=sys.stderr), embed=not args.no_embed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result.get("power", {}).get("goals"), indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
