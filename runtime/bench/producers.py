"""Benchmark: chat time-to-first-token with every producer (and an embedding flood) busy.

``python -m uniun.runtime.bench.producers [--model M] [--chats N] [--out FILE]
[--modes idle,flood,...] [--flood-texts T] [--flood-in-flight K]``

Two runtimes, each over a temporary home with the shared model store:

- ``idle``: scheduler and runner only. ``N`` chats, one after another.
- ``producers``: the default producers (extract with a 40-note backlog, Nataraj,
  gana-cron, background-Gana) and the embedding pool (embedding the notes). The chats are
  sent once the runner is busy with producer work.
- ``flood``: the same, plus a process of its own flooding the embedding pool with requests
  the whole time (on a machine with few cores the pool's workers compete with the runner
  for CPU).
- ``pool_flood``: scheduler, runner and the embedding pool, no producer, and the same flood
  process: what the pool alone costs a chat while another app floods it. Paired in one
  runtime: each flood chat follows an idle chat sent while the flood was paused and the
  pool had drained, so a shared machine's changing load shifts both alike
  (``ratio_paired_p50``: the median of the flood chats over the median of the idle
  ones).
- ``flood_paired``: ``flood``, paired the same way: each flood chat follows a chat sent
  with the producers busy and the flood paused (the pool drained), so the ratio is what
  the flood adds to a loaded runtime.
- ``embed``: scheduler, runner and the embedding pool, no producer and no chat: the
  pool's throughput inside the runtime (its priority, thread budget and yield listener
  included), 48 requests of 8 texts at once, as ``bench/embedding.py`` sends them.

The loaded modes time chats in the steady state: from ``SETTLE_S`` after the runtime is
ready (the producer processes' own start-up is over: imports, first files) and, for
``flood``, once the flood's process answers requests. For ``producers`` and ``flood``
the pool's own counters say how many embedding requests waited for a chat to end
(``yielded``), how long (total, mean, max), and how many were refused
(``rejected_full``; the flood's own count of refusals beside it).

The flood keeps ``flood_in_flight`` requests of ``flood_texts`` texts each in flight
(default 16 of 1 text; ``--flood-texts 32 --flood-in-flight 6`` is another app embedding
its documents in pages of 32): a new request is sent as the oldest is answered. One-text
requests are ``flood sentence number N``; larger ones are note-like sentences of 8-40
words (``bench/embedding.py:corpus``).

``device``: extra TOML appended to every mode's config, e.g. ``"[device]\nyield_signal =
false\n"`` to measure what one mechanism buys (docs/device.md).

Per mode: client-side TTFT (submit sent -> first ``token``) median and 90th percentile,
and for the loaded modes what the producers got done meanwhile. Results go to
``bench/results/chat-ttft-producers.json`` (default). Figures depend on the machine's load; the
point is the ratio loaded / idle, which the five-tier policy keeps small.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniun.actors.producers.results import ResultsStore
from uniun.protocol.client import Client
from uniun.runtime.bench.launch import launched

CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
WAIT_S = 300.0
QUIET = ("[producers]\nextract = false\nnataraj = false\ngana = false\nbackground_gana = false\n"
         "[embed]\nenabled = false\n[http]\nport = 0\n")
LOADED = "[embed]\nenabled = true\n[producers]\ndeck_low = 6\ndeck_high = 12\n[http]\nport = 0\n"
SETTLE_S = 10.0  # after ready, before the loaded modes' first chat: steady state, not start-up
FLOOD_FLOWING = 64  # flood requests answered before the first chat (its process has started)
EMBED_ONLY = QUIET.replace("[embed]\nenabled = false", "[embed]\nenabled = true\nqueue_bound = 64")


def _wait(what: str, check: Any, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception:  # noqa: BLE001 - not up yet, whatever the reason: ask again
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def _chat_ttft(client: Client, model: str) -> float:
    job = {"job_id": f"bench-chat-{uuid.uuid4().hex[:8]}", "kind": "chat", "messages": CHAT,
           "max_new_tokens": 8, "model_id": model}
    sent = time.monotonic()
    first = None
    for event in client.submit(job):
        if event["type"] == "token" and first is None:
            first = time.monotonic() - sent
        if event["type"] in ("done", "error"):
            break
    if first is None:
        raise RuntimeError(f"chat {job['job_id']} streamed no token")
    return first


def _flood(endpoint: str, stop: Any, ok: Any, refused: Any, texts: int = 1,
           in_flight: int = 16, paused: Any = None) -> None:
    """The flood, in a process of its own (as another app on the device would be): in the
    timing client's process its GIL would delay the chat's tokens being read, which is
    the bench's own cost, not the runtime's. ``in_flight`` requests of ``texts`` texts
    are kept in flight: a new one goes out as the oldest is answered. A refused request
    (``queue_full``) is counted and sent again after its ``retry_after_s`` hint (0.1 s
    without one), as a well-behaved client would. While ``paused`` is set it sends
    nothing new and collects what is in flight."""
    from collections import deque

    from uniun.protocol.embed_client import EmbedClient
    from uniun.runtime.bench.embedding import corpus

    pages = corpus(texts * 64, seed=11)

    def batch(i: int) -> list[str]:
        if texts == 1:
            return [f"flood sentence number {i}"]
        start = (i * texts) % len(pages)
        return (pages[start:] + pages[:start])[:texts]

    with EmbedClient(endpoint, timeout=120) as pool:
        i = 0
        window: deque[str] = deque()
        while not stop.is_set():
            if paused is not None and paused.is_set() and not window:
                stop.wait(0.02)
                continue
            while len(window) < in_flight and not (paused is not None and paused.is_set()):
                window.append(pool.submit(batch(i)))
                i += 1
            oldest = window.popleft()
            result = pool.wait([oldest])[oldest]
            counter = refused if isinstance(result, Exception) else ok
            with counter.get_lock():
                counter.value += 1
            if isinstance(result, Exception):
                hint = getattr(result, "retry_after_s", None)
                stop.wait(hint if isinstance(hint, (int, float)) and hint > 0 else 0.1)


class _FloodProcess:
    """Start/stop of :func:`_flood` in a spawned process, with its two counters."""

    def __init__(self, endpoint: str, texts: int = 1, in_flight: int = 16) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop, self.paused = ctx.Event(), ctx.Event()
        self.ok, self.refused = ctx.Value("q", 0), ctx.Value("q", 0)
        self.proc = ctx.Process(target=_flood, daemon=True, name="embed-flood",
                                args=(endpoint, self.stop, self.ok, self.refused, texts,
                                      in_flight, self.paused))

    def start(self) -> None:
        self.proc.start()

    def close(self) -> None:
        self.stop.set()
        if self.proc.pid is not None:
            self.proc.join(timeout=30)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()

    def counts(self) -> dict[str, int]:
        return {"ok": self.ok.value, "refused": self.refused.value}


def _embed_throughput(endpoint: str, *, requests: int = 48, per_request: int = 8
                      ) -> dict[str, Any]:
    """Texts/s of ``requests`` requests of ``per_request`` texts sent at once."""
    from uniun.protocol.embed_client import EmbedClient
    from uniun.runtime.bench.embedding import corpus

    texts = corpus(requests * per_request)
    batches = [texts[i::requests] for i in range(requests)]
    with EmbedClient(endpoint, timeout=300) as pool:
        _wait("the embedding workers", lambda: sum(
            w.get("state") == "idle" for w in pool.status(timeout=10)["workers"]) >= 2)
        pool.wait([pool.submit(texts[i:i + 4]) for i in range(4)])  # warm every worker
        start = time.perf_counter()
        replies = pool.wait([pool.submit(batch) for batch in batches])
        wall = time.perf_counter() - start
    refused = sum(isinstance(r, Exception) for r in replies.values())
    return {"texts_per_s": len(texts) / wall, "texts": len(texts), "refused": refused}


def _pool_waits(endpoint: str) -> dict[str, Any]:
    """The pool's own count of requests that waited for interactive work, and how long."""
    from uniun.protocol.embed_client import EmbedClient

    with EmbedClient(endpoint, timeout=30) as pool:
        st = pool.status(timeout=30)
    n = st.get("yielded", 0)
    return {"answered": st.get("answered"), "rejected_full": st.get("rejected_full"),
            "waited": n, "wait_total_s": round(st.get("yield_wait_s", 0.0), 3),
            "wait_mean_s": round(st.get("yield_wait_s", 0.0) / n, 4) if n else 0.0,
            "wait_max_s": round(st.get("yield_wait_max_s", 0.0), 4),
            "micro_batch": st.get("micro_batch"), "micro_batches": st.get("micro_batches"),
            "pauses": st.get("yield_pauses"),
            "pauses_within_request": st.get("yield_pauses_within")}


def _pool_quiet(endpoint: str) -> bool:
    """Nothing waiting or running in the pool."""
    from uniun.protocol.embed_client import EmbedClient

    with EmbedClient(endpoint, timeout=10) as pool:
        st = pool.status(timeout=10)
    return st.get("queued") == 0 and st.get("running") == 0


def _paired_chats(client: Client, model: str, flood: _FloodProcess, embed_ep: str,
                  chats: int, log: Any, ready: Callable[[], None] = lambda: None,
                  mode: str = "pool_flood") -> dict[str, Any]:
    """``chats`` pairs: an idle chat (flood paused, pool drained), then a flood chat (flood
    resumed and flowing again). ``ready`` runs before each chat (e.g. wait until the
    runner is busy with producer work)."""
    idle, flooded = [], []
    for n in range(chats):
        flood.paused.set()
        _wait("the pool to drain", lambda: _pool_quiet(embed_ep))
        time.sleep(0.5)
        ready()
        idle.append(_chat_ttft(client, model))
        flood.paused.clear()
        before = flood.counts()["ok"]
        _wait("the flood flowing again", lambda b=before: flood.counts()["ok"] >= b + 2)
        ready()
        flooded.append(_chat_ttft(client, model))
        log(f"{mode}: pair {n + 1}/{chats} first token without the flood "
            f"{idle[-1]:.3f}s, with it {flooded[-1]:.3f}s")
        time.sleep(0.5)
    return {"ttft_p50_s": statistics.median(flooded),
            "ttft_p90_s": sorted(flooded)[max(0, round(0.9 * len(flooded)) - 1)],
            "ttft_all_s": [round(t, 4) for t in flooded],
            "ttft_idle_p50_s": statistics.median(idle),
            "ttft_idle_all_s": [round(t, 4) for t in idle],
            "ratio_paired_p50": statistics.median(flooded) / statistics.median(idle)}


def run_mode(mode: str, model: str, chats: int, log: Any, device: str = "", *,
             flood_texts: int = 1, flood_in_flight: int = 16) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"uniun-bench-{mode}-") as tmp:
        home = Path(tmp)
        config = f'[models]\nchat_model = "{model}"\n' + (
            QUIET if mode == "idle" else EMBED_ONLY if mode in ("embed", "pool_flood")
            else LOADED) + device
        if mode in ("producers", "flood", "flood_paired"):
            notes = home / "notes"
            notes.mkdir()
            for i in range(40):
                (notes / f"n{i:02d}.md").write_text(
                    f"# Note {i}\nPerson {i} met a friend in city {i} to talk about books.\n")
        with launched(home, config):
            flood: _FloodProcess | None = None
            try:
                client = Client(f"ipc://{home / 'run' / 'front.sock'}", timeout=60)
                _wait("the runtime", lambda: client.status(timeout=5).get("ready"))
                ready_at = time.monotonic()
                embed_ep = f"ipc://{home / 'run' / 'embed.sock'}"
                if mode == "embed":
                    _wait("the embedding pool", lambda: (home / "run" / "embed.sock").exists())
                    result = _embed_throughput(embed_ep)
                    log(f"embed: {result['texts_per_s']:.1f} texts/s, no chat in flight")
                    client.close()
                    return result
                if mode in ("flood", "pool_flood", "flood_paired"):
                    flood = _FloodProcess(embed_ep, flood_texts, flood_in_flight)
                    _wait("the embedding pool", lambda: (home / "run" / "embed.sock").exists())
                    flood.start()
                    _wait("the flood flowing", lambda: flood.counts()["ok"] >= FLOOD_FLOWING)
                if mode != "idle":  # the producers' own start (imports, first files) is over
                    time.sleep(max(0.0, SETTLE_S - (time.monotonic() - ready_at)))
                ttfts = []
                paired: dict[str, Any] = {}

                def producer_work() -> None:
                    _wait("producer work running", lambda: (client.status(timeout=5)
                                                            .get("running") or {}).get("kind")
                          not in (None, "chat"))

                if mode in ("pool_flood", "flood_paired"):
                    assert flood is not None
                    paired = _paired_chats(client, model, flood, embed_ep, chats, log, mode=mode,
                                           ready=producer_work if mode == "flood_paired"
                                           else lambda: None)
                    ttfts = paired["ttft_all_s"]
                for n in range(chats if mode not in ("pool_flood", "flood_paired") else 0):
                    if mode in ("producers", "flood"):
                        producer_work()
                    ttfts.append(_chat_ttft(client, model))
                    log(f"{mode}: chat {n + 1}/{chats} first token after {ttfts[-1]:.3f}s")
                    time.sleep(1.0)
                result = {
                    "ttft_p50_s": statistics.median(ttfts),
                    "ttft_p90_s": sorted(ttfts)[max(0, round(0.9 * len(ttfts)) - 1)],
                    "ttft_all_s": [round(t, 4) for t in ttfts], **paired}
                if mode != "idle":
                    counts = flood.counts() if flood is not None else {"ok": 0, "refused": 0}
                    with ResultsStore(home / "results.db") as store:
                        result["meanwhile"] = {
                            "notes_extracted": len(store.list_results("knowledge", limit=10_000)),
                            "notes_embedded": len(store.note_embeddings()[0]),
                            "cards": len(store.list_results("card", limit=10_000)),
                            "gana_runs": len(store.gana_runs()),
                            "embed_flood_answered": counts["ok"],
                            "embed_flood_refused": counts["refused"]}
                    result["embed_waits"] = _pool_waits(embed_ep)
                client.close()
                return result
            finally:
                if flood is not None:
                    flood.close()


def run(model: str, chats: int, log: Callable[[str], None], *, device: str = "",
        modes: tuple[str, ...] = ("idle", "producers", "flood", "embed"),
        flood_texts: int = 1, flood_in_flight: int = 16) -> dict[str, Any]:
    """The modes and the loaded / idle ratios (part of the default ``bench``)."""
    results: dict[str, Any] = {
        mode: run_mode(mode, model, chats, log, device, flood_texts=flood_texts,
                       flood_in_flight=flood_in_flight) for mode in modes}
    if any(mode in modes for mode in ("flood", "pool_flood", "flood_paired")):
        results["flood_shape"] = {"texts_per_request": flood_texts,
                                  "in_flight": flood_in_flight}
    for mode in ("producers", "flood", "pool_flood"):
        if mode in results and "idle" in results:
            results[f"ratio_p50_{mode}"] = (results[mode]["ttft_p50_s"]
                                            / results["idle"]["ttft_p50_s"])
    results["model"] = model
    if device:
        results["device"] = device
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uniun.runtime.bench.producers")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--chats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("bench/results/chat-ttft-producers.json"))
    parser.add_argument("--device", default="", help="extra TOML for every mode, e.g. "
                        "'[device]\\nyield_signal = false'")
    parser.add_argument("--modes", default="idle,producers,flood,embed",
                        help="any of idle, producers, flood, pool_flood, flood_paired, "
                             "embed")
    parser.add_argument("--flood-texts", type=int, default=1,
                        help="texts per flood request (default 1)")
    parser.add_argument("--flood-in-flight", type=int, default=16,
                        help="flood requests kept in flight (default 16)")
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    results = run(args.model, args.chats, log, device=args.device.replace("\\n", "\n"),
                  modes=tuple(m for m in args.modes.split(",") if m),
                  flood_texts=args.flood_texts, flood_in_flight=args.flood_in_flight)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
