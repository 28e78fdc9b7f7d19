"""The console's goals, each measured with a real page in headless Chromium.

Every function takes a launched browser (``runtime/bench/browser.py``), the gateway's base
URL and the scheduler's front, and returns a map of what it measured. Times are wall
clock: the page, the bench and the runtime run on one machine, so the page's clock
(``performance.timeOrigin + performance.now()``) and the scheduler's timestamps agree to
well under a millisecond. See :mod:`uniun.runtime.bench.console` for the goals.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from uniun.protocol.client import Client, ClientError

__all__ = ["open_page", "page_weight", "phone_usability", "preempt_latency",
           "runtime_ttft_open_vs_closed", "screenshots", "ttft_page_vs_api"]

Log = Callable[[str], None]
CHAT = "What is a good name for a cat? Answer in one sentence."
CHAT_TOKENS = 8
# A story to continue (a raw prompt: an instruction alone makes SmolLM2 stop at once).
BG_PROMPT = ("Once upon a time, in a lighthouse by the sea, there lived an old keeper who "
             "collected clocks. Every morning he")
WAIT_S = 300.0
PANELS = ("chat", "timeline-panel", "device", "results", "control")


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": round(statistics.median(values), 4),
            "p90": round(_p(values, 0.9), 4), "max": round(max(values), 4),
            "values": [round(v, 4) for v in values]}


def open_page(browser: Any, url: str, **context: Any) -> tuple[Any, Any, dict[str, list]]:
    """A fresh context and page on the console once its feed is live."""
    ctx = browser.new_context(**context)
    page = ctx.new_page()
    seen: dict[str, list] = {"requests": [], "responses": [], "errors": []}
    page.on("request", lambda r: seen["requests"].append(r.url))
    page.on("response", lambda r: seen["responses"].append(r))
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))
    page.set_default_timeout(WAIT_S * 1000)
    page.goto(url + "/")
    page.locator("#link.up").wait_for()
    return ctx, page, seen


def _drawn_preemptions(page: Any, job_id: str) -> list[dict[str, Any]]:
    """The preemption marks of ``job_id`` the page's timeline has drawn so far."""
    return [d for d in page.evaluate("window.uniunConsole.timeline.drawn")
            if d["what"] == "preempt" and d["job_id"] == job_id]


def _paused_segments(page: Any, job_id: str) -> list[dict[str, Any]]:
    """The runner segments of ``job_id`` the page holds that ended in a preemption."""
    return [s for s in page.evaluate("window.uniunConsole.live.segments")
            if s["job_id"] == job_id and s["lane"] == "run" and s["reason"] == "preempted"]


def _until(what: str, check: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


# -- page weight and the phone -----------------------------------------------------------

def page_weight(browser: Any, url: str) -> dict[str, Any]:
    """Bytes of the first load (every response but the live feed), and the feed's first
    frame; requests that went anywhere but the runtime."""
    ctx, page, seen = open_page(browser, url, viewport={"width": 1280, "height": 900})
    try:
        page.locator("#model option").first.wait_for(state="attached")
        page.locator("#result-list > *").first.wait_for()
        time.sleep(0.5)
        by_kind: dict[str, int] = {}
        files: dict[str, int] = {}
        for response in seen["responses"]:
            if "/console/api/events" in response.url or response.status != 200:
                continue
            size = len(response.body())
            kind = response.request.resource_type
            by_kind[kind] = by_kind.get(kind, 0) + size
            files[response.url.removeprefix(url)] = size
        foreign = [u for u in seen["requests"] if not u.startswith(url)]
    finally:
        ctx.close()
    with httpx.stream("GET", url + "/console/api/events", timeout=30) as feed:
        first = b""
        for chunk in feed.iter_bytes():
            first += chunk
            if b"\n\n" in first:
                break
    total = sum(by_kind.values())
    return {"bytes": total, "by_resource_type": by_kind, "files": files,
            "feed_first_frame_bytes": first.index(b"\n\n") + 2,
            "bytes_with_feed_first_frame": total + first.index(b"\n\n") + 2,
            "requests_outside_the_runtime": foreign, "page_errors": seen["errors"]}


def phone_usability(browser: Any, url: str) -> dict[str, Any]:
    """At 390 px: the page's width, and every panel reached from the top bar."""
    ctx, page, seen = open_page(browser, url, viewport={"width": 390, "height": 844},
                                is_mobile=True, has_touch=True, device_scale_factor=2)
    try:
        panels: dict[str, Any] = {}
        for panel in PANELS:
            page.click(f"nav.jump a[href='#{panel}']")
            time.sleep(0.2)
            box = page.locator(f"#{panel}").bounding_box() or {}
            top = page.evaluate(
                f"document.getElementById({panel!r}).getBoundingClientRect().top")
            panels[panel] = {"x": box.get("x"), "width": box.get("width"), "top": top,
                             "reached": bool(box) and box["x"] >= 0
                             and box["x"] + box["width"] <= 390 and 0 <= top < 844}
        width = page.evaluate("document.documentElement.scrollWidth")
        return {"viewport": [390, 844], "scroll_width": width,
                "no_horizontal_scroll": width <= 390, "panels": panels,
                "usable": width <= 390 and all(p["reached"] for p in panels.values()),
                "page_errors": seen["errors"]}
    finally:
        ctx.close()


# -- preemption on the page's timeline ------------------------------------------------------

def _status(client: Client) -> dict[str, Any]:
    return client.status(timeout=30)


def _start_background(client: Client, job_id: str, tokens: int) -> None:
    client.submit({"job_id": job_id, "kind": "nataraj", "prompt": BG_PROMPT,
                   "max_new_tokens": tokens})

    def generating() -> bool:
        running = _status(client).get("running") or {}
        return running.get("job_id") == job_id and running.get("tokens", 0) >= 3

    _until(f"{job_id} generating", generating)


def _cancel(client: Client, job_id: str) -> None:
    """Cancel a background job of the bench (it may have ended by itself already)."""
    with contextlib.suppress(ClientError):
        client.cancel(job_id)


def _chat_ttft(client: Client, job_id: str) -> tuple[float, dict[str, Any]]:
    """A chat over the protocol: seconds from submit to its first token, and its done."""
    start = time.perf_counter()
    stream = client.submit({"job_id": job_id, "kind": "chat", "max_new_tokens": CHAT_TOKENS,
                            "messages": [{"role": "user", "content": CHAT}]})
    first = None
    done: dict[str, Any] = {}
    for event in stream:
        if event["type"] == "token" and first is None:
            first = time.perf_counter() - start
        if event["type"] in ("done", "error"):
            done = event
    if first is None or done.get("type") != "done":
        raise RuntimeError(f"chat {job_id} failed: {done}")
    return first, done


def preempt_latency(browser: Any, url: str, front: str, reps: int, log: Log,
                    bg_tokens: int = 2000) -> dict[str, Any]:
    """How long after a preemption the page has drawn it on its timeline: from the
    scheduler's preempt mark (its decision) and from the end of the background job's run
    segment (the runner stopped), to the frame that drew the mark."""
    ctx, page, _seen = open_page(browser, url, viewport={"width": 1280, "height": 900})
    from_mark: list[float] = []
    from_stop: list[float] = []
    try:
        page.click("#window-buttons button[data-window='30']")
        with Client(front, timeout=30) as client:
            for rep in range(reps):
                bg = f"bench-console-bg-{rep}-{int(time.time())}"
                _start_background(client, bg, bg_tokens)
                _chat_ttft(client, f"bench-console-chat-{rep}-{int(time.time())}")
                drawn = _until("the preemption drawn", partial(_drawn_preemptions, page, bg))[0]
                stop = _until("the paused segment", partial(_paused_segments, page, bg))[0]
                from_mark.append(drawn["drawn_at"] - drawn["at"])
                from_stop.append(drawn["drawn_at"] - stop["end"])
                _cancel(client, bg)
                log(f"console: preemption drawn {from_mark[-1] * 1000:.0f} ms after the "
                    f"scheduler's mark, {from_stop[-1] * 1000:.0f} ms after the runner stopped")
                time.sleep(0.5)
    finally:
        ctx.close()
    return {"from_mark_s": summary(from_mark), "from_runner_stop_s": summary(from_stop)}


# -- chat TTFT: typed in the page vs the API -------------------------------------------------

def _stream_ttft(url: str, body: dict[str, Any]) -> float:
    start = time.perf_counter()
    first = None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=WAIT_S) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                chunk = json.loads(line[6:])
                delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
                if delta.get("content"):
                    first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("the chat streamed no text")
    return first


def _page_chat(page: Any) -> dict[str, Any]:
    before = page.evaluate("window.uniunConsole.chat.log.length")
    page.click("#new-chat")
    page.fill("#prompt", CHAT)
    page.press("#prompt", "Enter")

    def answered() -> dict[str, Any] | None:
        log = page.evaluate("window.uniunConsole.chat.log")
        return log[-1] if len(log) > before and log[-1]["done_at"] else None

    return _until("the page's answer", answered)


def ttft_page_vs_api(browser: Any, url: str, model: str, reps: int, log: Log
                     ) -> dict[str, Any]:
    """Idle: the same chat typed in the page and sent over the API, interleaved."""
    ctx, page, _ = open_page(browser, url, viewport={"width": 1280, "height": 900})
    page_s: list[float] = []
    api_s: list[float] = []
    try:
        page.click("#chat details.settings summary")
        page.fill("#max-tokens", str(CHAT_TOKENS))
        body = {"model": model, "messages": [{"role": "user", "content": CHAT}],
                "stream": True, "max_tokens": CHAT_TOKENS}
        _stream_ttft(url, body)  # warm-up
        _page_chat(page)
        for _ in range(reps):
            api_s.append(_stream_ttft(url, body))
            record = _page_chat(page)
            if record["error"] or record["first_token_at"] is None:
                raise RuntimeError(f"the page's chat failed: {record}")
            page_s.append(record["first_token_at"] - record["sent_at"])
            log(f"console: TTFT page {page_s[-1] * 1000:.0f} ms, API {api_s[-1] * 1000:.0f} ms")
    finally:
        ctx.close()
    return {"page_s": summary(page_s), "api_s": summary(api_s),
            "ratio_p50": round(statistics.median(page_s) / statistics.median(api_s), 4)}


# -- the runtime's chat TTFT with the console open vs closed ----------------------------------

def runtime_ttft_open_vs_closed(browser: Any, url: str, front: str, reps: int, blocks: int,
                                idle_close_s: float, log: Log) -> dict[str, Any]:
    """Chats over the protocol while a background job runs, in blocks with no console and
    with one open and streaming (the feed and the page drawing), alternating."""
    closed: list[float] = []
    opened: list[float] = []
    closed_sched: list[float] = []
    opened_sched: list[float] = []
    with Client(front, timeout=30) as client:
        for block in range(2 * blocks):
            is_open = block % 2 == 1
            ctx = None
            if is_open:
                ctx, page, _ = open_page(browser, url, viewport={"width": 1280, "height": 900})
                page.click("#window-buttons button[data-window='30']")
            else:
                time.sleep(idle_close_s + 1.0)  # the gateway's watch is closed by now
            bg = f"bench-console-load-{block}-{int(time.time())}"
            _start_background(client, bg, 4000)
            try:
                for rep in range(reps):
                    ttft, done = _chat_ttft(client, f"bench-console-oc-{block}-{rep}")
                    (opened if is_open else closed).append(ttft)
                    (opened_sched if is_open else closed_sched).append(
                        float(done["timings"]["ttft_s"]))
                    time.sleep(1.0)  # the background job resumes; the page draws it
            finally:
                _cancel(client, bg)
                if ctx is not None:
                    ctx.close()
            log(f"console: block {block} ({'open' if is_open else 'closed'}): chat TTFT p50 "
                f"{statistics.median((opened if is_open else closed)[-reps:]) * 1000:.0f} ms")
    return {"closed_s": summary(closed), "open_s": summary(opened),
            "ratio_p50": round(statistics.median(opened) / statistics.median(closed), 4),
            "scheduler_ttft_closed_s": summary(closed_sched),
            "scheduler_ttft_open_s": summary(opened_sched),
            "scheduler_ratio_p50": round(statistics.median(opened_sched)
                                         / statistics.median(closed_sched), 4)}


# -- screenshots in the middle of a preemption -----------------------------------------------

def screenshots(browser: Any, url: str, front: str, folder: Path, log: Log) -> dict[str, str]:
    """The console while a chat typed in it has paused a background job: at a laptop's
    width (the viewport) and at a phone's (the whole page)."""
    folder.mkdir(parents=True, exist_ok=True)
    shots: dict[str, tuple[dict[str, Any], bool]] = {
        "desktop": ({"viewport": {"width": 1440, "height": 900}}, False),
        "phone": ({"viewport": {"width": 390, "height": 844}, "is_mobile": True,
                   "has_touch": True, "device_scale_factor": 1}, True)}
    out: dict[str, str] = {}
    with Client(front, timeout=30) as client:
        for name, (context, full) in shots.items():
            ctx, page, _ = open_page(browser, url, **context)
            bg = f"console-nataraj-shot{name}"
            try:
                page.click("#window-buttons button[data-window='30']")
                _start_background(client, bg, 4000)
                time.sleep(4.0)  # a stretch of it on the runner's track
                page.click("#chat details.settings summary")
                page.fill("#max-tokens", "64")
                page.click("#chat details.settings summary")
                page.fill("#prompt", "What is a good name for a cat? Tell me why.")
                page.press("#prompt", "Enter")
                _until("the answer streaming while the job is paused", partial(
                    page.evaluate, "(() => { const s = window.uniunConsole.live.status; "
                    "const log = window.uniunConsole.chat.log; const r = log[log.length - 1]; "
                    "return s && s.running && s.running.kind === 'chat' && r && "
                    "r.text.length >= 25; })()"))
                path = folder / f"console-{name}.png"
                page.evaluate("window.scrollTo(0, 0)")
                page.screenshot(path=str(path), full_page=full)
                out[name] = str(path)
                log(f"console: screenshot {path}")
                time.sleep(3.0)
            finally:
                _cancel(client, bg)
                ctx.close()
    return out
