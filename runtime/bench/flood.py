"""Benchmark: another client's chat while one connection floods the front, unread.

``python -m uniun.runtime.bench.flood [--model M] [--requests N] [--chats C] [--out FILE]``

One runtime over a temporary home with the shared model store, everything at its default
but the producers (off, so the chats' times are the front's and not the background
work's). Then, as a buggy or hostile local program would:

1. a chat client (a raw DEALER speaking protocol v1 maps) measures its time to first
   token with the runtime idle;
2. a **flooder** in a process of its own connects one DEALER and sends ``status``
   requests as fast as ZeroMQ takes them (up to ``N``, and until the chats are timed),
   and never reads a reply; the result says how many it sent;
3. while it floods, the chat client measures its time to first token again, from one
   second in (while the flooder's unread replies fill its queue, the front's
   ``SNDHWM``: it builds a reply for each request it reads) and again from
   ``STEADY_AFTER_S`` in (its replies can no longer reach it: the front reads it at a bounded rate,
   docs/security.md); the scheduler's RSS is sampled throughout;
4. the flooder is killed (its connection drops), and a new client's ``status`` is timed
   from that moment until it is answered.

What it checks: the front's fairness and bounds (docs/security.md, "The ZeroMQ front").
:func:`batch_pick_bench` times the front's choice of the next batch with 10,000 and
100,000 requests pending (in process, no runtime): it must not grow with the backlog.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from uniun.runtime.bench.burst import RawClient, _chat, _ttft
from uniun.runtime.bench.launch import launched

CONFIG = ('[models]\nchat_model = "{model}"\n'
          "[producers]\nextract = false\nnataraj = false\ngana = false\n"
          "background_gana = false\n[http]\nport = 0\n")
WAIT_S = 300.0
SETTLE_S = 10.0  # after ready, before the idle chats: steady state, not start-up
STEADY_AFTER_S = 8.0  # from the flood's start: its queue of unread replies is full by then
# Sends status requests as fast as ZeroMQ takes them and never reads a reply, until
# argv[2] are sent or a line on its stdin says stop (a front that reads it slowly takes
# far fewer than that while the chats are timed); prints how many it sent, then stays
# connected until killed.
FLOODER = """
import select, sys, msgpack, zmq
ctx = zmq.Context()
sock = ctx.socket(zmq.DEALER)
sock.connect(sys.argv[1])
i, most = 0, int(sys.argv[2])
def told_to_stop(wait_s):
    return bool(select.select([sys.stdin], [], [], wait_s)[0])
while i < most and not told_to_stop(0):
    for _ in range(1000):
        try:
            sock.send(msgpack.packb({"v": 1, "type": "status", "id": f"f{i}"}), zmq.NOBLOCK)
        except zmq.Again:  # its queues are full: the front is not reading it now
            if told_to_stop(0.001):
                break
            continue
        i += 1
print(i, flush=True)
sys.stdin.read()
"""


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _RssPeak(threading.Thread):
    """Samples one process's RSS every 50 ms; ``peak`` is the largest seen."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak = pid, _rss(pid)
        self._stop_flag = threading.Event()

    def run(self) -> None:
        while not self._stop_flag.wait(0.05):
            try:
                self.peak = max(self.peak, _rss(self.pid))
            except OSError:
                return

    def stop(self) -> int:
        self._stop_flag.set()
        self.join()
        return self.peak


def _status(client: RawClient, timeout_s: float) -> dict[str, Any] | None:
    msg_id = client.send("status")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = client.recv(max(0.0, deadline - time.monotonic()))
        if msg and msg.get("re") == msg_id:
            return msg
    return None


def _ready(client: RawClient, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        msg = _status(client, 2.0)
        if msg and msg.get("type") == "status" and msg.get("ready"):
            return msg
    raise RuntimeError("the runtime did not become ready")


def batch_pick_bench(pending: tuple[int, ...] = (10_000, 100_000), rounds: int = 200
                     ) -> dict[str, float]:
    """Median ms to take one batch from a ``FairInbox`` holding ``pending`` requests of
    200 connections (half status, half bulk submits), for each size."""
    from uniun.actors.scheduler.front import BATCH_BULK, BATCH_CONTROL
    from uniun.actors.scheduler.inbox_order import FairInbox, Interactive, classify

    rules = Interactive()
    out: dict[str, float] = {}
    for size in pending:
        inbox = FairInbox(per_conn=size)
        for i in range(size + rounds * (BATCH_CONTROL + BATCH_BULK)):
            conn = b"c%d" % (i % 200)
            raw = ({"v": 1, "type": "status", "id": f"s{i}"} if i % 2 else
                   {"v": 1, "type": "submit", "id": f"j{i}",
                    "job": {"job_id": f"j{i}", "kind": "nataraj", "prompt": "x"}})
            inbox.push(classify(conn, raw, rules))
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            inbox.take_batch(BATCH_CONTROL, BATCH_BULK)
            times.append((time.perf_counter() - t0) * 1000)
        out[str(size)] = round(statistics.median(times), 4)
    return out


def run(model: str, requests: int, chats: int, log: Callable[[str], None]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="uniun-bench-flood-", dir="/tmp") as tmp:
        home = Path(tmp)
        endpoint = f"ipc://{home / 'run' / 'front.sock'}"
        with launched(home, CONFIG.format(model=model)) as proc, \
                closing(RawClient(endpoint)) as client:
            return _measure(client, proc, endpoint, model, requests, chats, log)


def _measure(client: RawClient, proc: subprocess.Popen[bytes], endpoint: str, model: str,
             requests: int, chats: int, log: Callable[[str], None]) -> dict[str, Any]:
    """The flood against a runtime that is starting: idle chats, flooded chats, RSS, the
    newcomer, and the batch pick alone."""
    flooder: subprocess.Popen[str] | None = None
    try:
        scheduler = _ready(client, proc)["processes"]["scheduler"]
        time.sleep(SETTLE_S)  # the other processes' start (the embedding pool) is over
        idle = [_ttft(client, _chat(model))[0] for _ in range(chats)]
        log(f"flood: idle chat TTFT p50 {statistics.median(idle):.3f}s")
        rss_before = _rss(scheduler)
        rss = _RssPeak(scheduler)
        rss.start()
        flooder = subprocess.Popen([sys.executable, "-c", FLOODER, endpoint,
                                    str(requests)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        flood_at = time.monotonic()
        time.sleep(1.0)  # the flood is under way
        flooded = [_ttft(client, _chat(model))[0] for _ in range(chats)]
        log(f"flood: chat TTFT during the flood p50 {statistics.median(flooded):.3f}s "
            f"(max {max(flooded):.3f}s)")
        time.sleep(max(0.0, STEADY_AFTER_S - (time.monotonic() - flood_at)))
        steady = [_ttft(client, _chat(model))[0] for _ in range(chats)]
        log(f"flood: chat TTFT once the flooder's replies are dropped p50 "
            f"{statistics.median(steady):.3f}s (max {max(steady):.3f}s)")
        assert flooder.stdin is not None and flooder.stdout is not None
        flooder.stdin.write("stop\n")  # a line, not EOF: it stays connected
        flooder.stdin.flush()
        sent = int(flooder.stdout.readline().strip() or 0)
        peak = rss.stop()
        flooder.send_signal(signal.SIGKILL)
        flooder.wait()
        gone_at = time.monotonic()
        fresh = RawClient(endpoint)
        answered = _status(fresh, 60.0)
        served_s = time.monotonic() - gone_at if answered else None
        fresh.close()
        log(f"flood: scheduler RSS {rss_before / 2**20:.0f} -> peak {peak / 2**20:.0f} "
            f"MiB; a new client served {served_s}s after the flooder was killed")
        picks = batch_pick_bench()
        log(f"flood: next batch chosen in {picks} ms (by requests pending)")
        return {"requests": requests, "chats": chats, "model": model,
                "batch_pick_ms_by_pending": picks,
                "flood_requests_sent": sent,
                "idle_ttft_s": [round(t, 4) for t in idle],
                "flood_ttft_s": [round(t, 4) for t in flooded],
                "idle_ttft_p50_s": statistics.median(idle),
                "flood_ttft_p50_s": statistics.median(flooded),
                "flood_ttft_max_s": max(flooded),
                "flood_vs_idle_p50": statistics.median(flooded) / statistics.median(idle),
                "steady_ttft_s": [round(t, 4) for t in steady],
                "steady_vs_idle_p50": statistics.median(steady) / statistics.median(idle),
                "scheduler_rss_before_bytes": rss_before,
                "scheduler_rss_peak_bytes": peak,
                "scheduler_rss_growth_bytes": peak - rss_before,
                "served_after_disconnect_s": served_s}
    finally:
        if flooder is not None and flooder.poll() is None:
            flooder.kill()
            flooder.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uniun.runtime.bench.flood")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=300_000)
    parser.add_argument("--chats", type=int, default=5)
    parser.add_argument("--out", type=Path,
                        default=Path("bench/results/chat-ttft-front-flood.json"))
    args = parser.parse_args(argv)
    result = run(args.model, args.requests, args.chats,
                 lambda line: print(line, file=sys.stderr, flush=True))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
