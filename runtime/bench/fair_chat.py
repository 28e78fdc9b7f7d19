"""Benchmark: chats of different clients share the runtime fairly (docs/scheduling.md, T0).

``python -m uniun.runtime.bench.fair_chat [--model M] [--reps R] [--tokens N] [--out FILE]``

One runtime of its own (producers and embeddings off) and its HTTP gateway; every
request is an OpenAI request over ``http.client``, as a user's program would send it.
Two clients, told apart as the gateway tells them (docs/http.md, "Who a client is"):
the *user* sends the console's cookie, the *other* program sends none. Two measures,
interleaved repetitions so that both sides of a ratio see the same machine:

- ``ttft``: the user's 4-token chat, time to its first streamed token, idle and while
  the other client's ``n: 4, max_tokens: 256`` chat generates (sent 0.5 s before).
  Goal: loaded / idle <= 1.5 (medians).
- ``tpot``: time per token of a long greedy completion (``--tokens``), each client
  alone, then both sent at once. ``each_over_alone`` is, per client, its time per token
  (first to last token) with both streaming over its time alone;
  ``each_latency_over_alone`` the same for (request sent to last token) / tokens, which
  also counts a wait for the other client's stream; ``ttft_both_s`` each one's first
  token. With one sequence per decode step two streams take twice the runner time of
  one: taking turns puts both near 2.0 (served first come, first served, one is near
  1.0 and waits nothing, the other waits the whole first stream). ``overhead`` (both
  clients' tokens per second together against one alone) is what the turns cost.
  Goal (with a batching runner): each_over_alone <= 1.3.

It runs with nothing but the standard library and ``launch.py``, so the same file can
measure an older checkout (its python, this path).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from uniun.runtime.bench.launch import launched

CONFIG = ('[models]\nchat_model = "{model}"\n'
          "[producers]\nextract = false\nnataraj = false\ngana = false\n"
          "background_gana = false\n[embed]\nenabled = false\n[http]\nport = 0\n")
USER_COOKIE = "uniun_client=bench-user-cookie-0001"  # the console's cookie: one browser
SHORT_CHAT = [{"role": "user", "content": "What is the capital of France?"}]
LONG_CHAT = [{"role": "user", "content": "Write a long story about a dragon."}]
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # a greedy model counts on for a long while
WAIT_S = 600.0
Log = Callable[[str], None]


def _post(url: str, path: str, body: dict[str, Any], cookie: str | None
          ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port,
                                      timeout=WAIT_S)
    headers = {"Content-Type": "application/json"}
    if cookie:
        headers["Cookie"] = cookie
    conn.request("POST", path, json.dumps(body), headers)
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
    return conn, response


def _stream(url: str, path: str, body: dict[str, Any], cookie: str | None
            ) -> tuple[float, list[float], int]:
    """Send a streamed request; return (sent, times of chunks with text, tokens)."""
    sent = time.monotonic()
    conn, response = _post(url, path, {**body, "stream": True,
                                       "stream_options": {"include_usage": True}}, cookie)
    times: list[float] = []
    tokens = 0
    try:
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or choice.get("text")
                if text:
                    times.append(time.monotonic())
    finally:
        conn.close()
    return sent, times, tokens


def _user_ttft(url: str, model: str) -> float:
    sent, times, _ = _stream(url, "/v1/chat/completions",
                             {"model": model, "messages": SHORT_CHAT, "max_tokens": 4,
                              "temperature": 0}, USER_COOKIE)
    return times[0] - sent if times else float("nan")


def _ttft_loaded(url: str, model: str) -> tuple[float, float]:
    """The user's TTFT while the other client's n=4 chat generates; and how long that
    chat took in all (it ends, it is not cancelled: its jobs must all finish)."""
    other: dict[str, float] = {}

    def background() -> None:
        start = time.monotonic()
        conn, response = _post(url, "/v1/chat/completions",
                               {"model": model, "messages": LONG_CHAT, "n": 4,
                                "max_tokens": 256, "temperature": 0.8, "seed": 1}, None)
        try:
            response.read()
        finally:
            conn.close()
        other["total_s"] = time.monotonic() - start

    thread = threading.Thread(target=background, daemon=True)
    thread.start()
    time.sleep(0.5)
    ttft = _user_ttft(url, model)
    thread.join(WAIT_S)
    return ttft, other.get("total_s", float("nan"))


def _tpot(url: str, model: str, tokens: int, cookie: str | None) -> dict[str, float]:
    sent, times, count = _stream(url, "/v1/completions",
                                 {"model": model, "prompt": COUNTING, "max_tokens": tokens,
                                  "temperature": 0}, cookie)
    if len(times) < 2 or count < 2:
        nan = float("nan")
        return {"tpot_s": nan, "tokens": count, "span_s": 0.0, "ttft_s": nan,
                "latency_per_token_s": nan, "start": nan, "end": nan, "sent": sent}
    span = times[-1] - times[0]
    return {"tpot_s": span / (count - 1), "tokens": count, "span_s": span,
            "ttft_s": times[0] - sent, "latency_per_token_s": (times[-1] - sent) / count,
            "start": times[0], "end": times[-1], "sent": sent}


def _tpot_both(url: str, model: str, tokens: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}

    def one(name: str, cookie: str | None) -> None:
        out[name] = _tpot(url, model, tokens, cookie)

    threads = [threading.Thread(target=one, args=("user", USER_COOKIE)),
               threading.Thread(target=one, args=("other", None))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    return out


def _wait_ready(home: Path, proc: Any) -> str:
    endpoint = home / "run" / "http.endpoint"
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the runtime exited; see {home / 'start.out'}")
        if endpoint.exists():
            url = endpoint.read_text().strip()
            try:
                parsed = urlparse(url)
                conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1",
                                                  parsed.port, timeout=10)
                conn.request("GET", "/health")
                ok = conn.getresponse().status == 200
                conn.close()
                if ok:
                    return url
            except OSError:
                pass
        time.sleep(0.5)
    raise RuntimeError("the runtime did not become ready")


def run(model: str, reps: int, tokens: int, log: Log) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="uniun-bench-fair-") as tmp:
        home = Path(tmp)
        with launched(home, CONFIG.format(model=model)) as proc:
            url = _wait_ready(home, proc)
            _user_ttft(url, model)  # warm-up
            idle: list[float] = []
            loaded: list[float] = []
            other_total: list[float] = []
            for rep in range(reps):
                idle.append(_user_ttft(url, model))
                ttft, total = _ttft_loaded(url, model)
                loaded.append(ttft)
                other_total.append(total)
                log(f"  rep {rep + 1}: user TTFT idle {idle[-1] * 1e3:.0f} ms, while the "
                    f"other's n=4 chat runs {ttft * 1e3:.0f} ms (that chat took {total:.1f} s)")
            alone: dict[str, list[float]] = {"user": [], "other": []}
            both: dict[str, list[float]] = {"user": [], "other": []}
            lat_alone: dict[str, list[float]] = {"user": [], "other": []}
            lat_both: dict[str, list[float]] = {"user": [], "other": []}
            ttft_both: dict[str, list[float]] = {"user": [], "other": []}
            agg_alone: list[float] = []
            agg_both: list[float] = []
            for rep in range(reps):
                a_user = _tpot(url, model, tokens, USER_COOKIE)
                a_other = _tpot(url, model, tokens, None)
                pair = _tpot_both(url, model, tokens)
                for name, a in (("user", a_user), ("other", a_other)):
                    alone[name].append(a["tpot_s"])
                    both[name].append(pair[name]["tpot_s"])
                    lat_alone[name].append(a["latency_per_token_s"])
                    lat_both[name].append(pair[name]["latency_per_token_s"])
                    ttft_both[name].append(pair[name]["ttft_s"])
                agg_alone.append(statistics.mean([1 / a_user["tpot_s"], 1 / a_other["tpot_s"]]))
                start = min(p["start"] for p in pair.values())
                end = max(p["end"] for p in pair.values())
                agg_both.append(sum(p["tokens"] for p in pair.values()) / (end - start))
                log(f"  rep {rep + 1}: ms/token alone user {a_user['tpot_s'] * 1e3:.1f}, "
                    f"other {a_other['tpot_s'] * 1e3:.1f}; both at once user "
                    f"{pair['user']['tpot_s'] * 1e3:.1f}, other "
                    f"{pair['other']['tpot_s'] * 1e3:.1f} "
                    f"({pair['user']['tokens']:.0f}+{pair['other']['tokens']:.0f} tokens; "
                    f"first tokens after {pair['user']['ttft_s']:.2f} s and "
                    f"{pair['other']['ttft_s']:.2f} s)")
    med = statistics.median
    each = {name: med(both[name]) / med(alone[name]) for name in ("user", "other")}
    each_latency = {name: med(lat_both[name]) / med(lat_alone[name])
                    for name in ("user", "other")}
    result = {
        "ttft": {"idle_s": med(idle), "loaded_s": med(loaded),
                 "loaded_over_idle": med(loaded) / med(idle), "goal": 1.5,
                 "other_n4_total_s": med(other_total),
                 "samples": {"idle": idle, "loaded": loaded}},
        "tpot": {"alone_s": {k: med(v) for k, v in alone.items()},
                 "both_s": {k: med(v) for k, v in both.items()},
                 "each_over_alone": each, "goal": 1.3,
                 "latency_per_token_s": {"alone": {k: med(v) for k, v in lat_alone.items()},
                                         "both": {k: med(v) for k, v in lat_both.items()}},
                 "each_latency_over_alone": each_latency,
                 "ttft_both_s": {k: med(v) for k, v in ttft_both.items()},
                 "one_sequence_per_step_bound": 2.0,
                 "tokens_per_s_alone": med(agg_alone), "tokens_per_s_both": med(agg_both),
                 "overhead": med(agg_alone) / med(agg_both),
                 "samples": {"alone": alone, "both": both}},
    }
    log(f"  user TTFT: idle {med(idle) * 1e3:.0f} ms, loaded {med(loaded) * 1e3:.0f} ms "
        f"({result['ttft']['loaded_over_idle']:.2f}x, goal <= 1.5)")
    log(f"  time per token both / alone: user {each['user']:.2f}x, other "
        f"{each['other']:.2f}x (2.0 = an even split of one sequence per step); "
        f"sent-to-last-token per token: user {each_latency['user']:.2f}x, other "
        f"{each_latency['other']:.2f}x; switching overhead {result['tpot']['overhead']:.2f}x")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uniun.runtime.bench.fair_chat",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="chat model (default smollm2-135m-instruct)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument("--tokens", type=int, default=128,
                        help="tokens of each time-per-token completion (default 128)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/chat-fair-share.json"),
                        help="results file (default bench/results/chat-fair-share.json)")
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = {"model": args.model, "reps": args.reps, "tokens": args.tokens,
              "date": time.strftime("%Y-%m-%d"), **run(args.model, args.reps, args.tokens, log)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
