"""The console in a real browser (headless Chromium driven by Playwright), on a real runtime.

The runtime is the product's (supervisor, scheduler, runner, gateway; the tiny model) and
the page is the one it serves; everything the page does goes through the gateway's door
like any browser's requests. A background job is made long by its token count at the
test token pace (``UNIUN_TEST_TOKEN_PACE_S``), so a chat typed while it runs always
finds it running, however slow the machine.

Without a browser (no Chromium, no Playwright) the browser tests are skipped with the
reason on pytest's summary line; the chaos round (plain HTTP) runs anyway.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.wait import WAIT_S, wait_for
from uniun.actors.policy.tiers import TIER_LABELS
from uniun.runtime.bench.browser import browser, why_no_browser
from uniun.runtime.runner_main import TOKEN_PACE_ENV

from .harness import BASE_CONFIG, Runtime, serving

pytestmark = pytest.mark.integration

CONFIG = BASE_CONFIG + "\n[http]\nport = 0\n"
PACE_S = 0.008  # s per token at least: the background job lasts >= BG_TOKENS * PACE_S
BG_TOKENS = 4000  # 32 s at least (max_new_tokens_cap is 4096); cancelled once seen
CHAT_TOKENS = 48
PANELS = ("chat", "timeline-panel", "device", "results", "control")
PAGE_WEIGHT_MAX = 300 * 1024  # bytes at first load (docs/console.md, goals)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    why = why_no_browser()
    if why is not None:
        pytest.skip(f"console browser tests need a browser: {why}")
    with browser() as b:
        yield b


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Iterator[Runtime]:
    with serving(tmp_path_factory.mktemp("rt-console"),
                 CONFIG, "scheduler,runner,http", {TOKEN_PACE_ENV: str(PACE_S)}) as runtime:
        yield runtime


@pytest.fixture(scope="module")
def base_url(rt: Runtime) -> str:
    return rt.gateway_url()


def _open(chromium: Any, base_url: str, **context: Any) -> tuple[Any, Any, dict[str, list]]:
    """A fresh page on the console, once its live feed is up; what it asked and broke."""
    ctx = chromium.new_context(**context)
    page = ctx.new_page()
    seen: dict[str, list] = {"requests": [], "errors": [], "responses": []}
    page.on("request", lambda r: seen["requests"].append(r.url))
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))
    page.on("response", lambda r: seen["responses"].append(r))
    page.set_default_timeout(WAIT_S * 1000)
    page.goto(base_url + "/")
    page.locator("#link.up").wait_for()
    return ctx, page, seen


def _js(page: Any, script: str) -> Any:
    """Evaluate in the page (through the DevTools protocol: the page's CSP forbids eval)."""
    return page.evaluate(script)


def _marks(page: Any, what: str, job_id: str) -> list[dict[str, Any]]:
    return _js(page, f"window.uniunConsole.live.marks.filter(m => m.what === {what!r} "
                     f"&& m.job_id === {job_id!r})")


def test_a_chat_typed_in_the_page_preempts_the_job_submitted_from_it(
        chromium: Any, base_url: str) -> None:
    ctx, page, seen = _open(chromium, base_url, viewport={"width": 1280, "height": 900})
    try:
        page.click("#window-buttons button[data-window='30']")
        # A long background job, submitted from the page's control panel.
        page.select_option("#submit-kind", "nataraj")
        page.fill("#submit-tokens", str(BG_TOKENS))
        page.click("#submit-form button[type=submit]")
        out = page.locator("#submit-out", has_text="submitted console-nataraj-")
        out.wait_for()
        bg = out.text_content().split()[1]
        # The device panel shows it running, pushed by the feed.
        page.locator("#running code", has_text=bg).wait_for()

        # Every change of the answer's bubble is recorded, to see it grow token by token.
        _js(page, """() => {
            window.__lengths = [];
            new MutationObserver(() => {
                const all = document.querySelectorAll('.msg.assistant');
                if (all.length) window.__lengths.push(all[all.length - 1].textContent.length);
            }).observe(document.querySelector('#messages'),
                       {subtree: true, childList: true, characterData: true});
        }""")
        page.click("#chat details.settings summary")
        page.fill("#max-tokens", str(CHAT_TOKENS))
        page.fill("#prompt", "Hello! How are you?")
        page.press("#prompt", "Enter")
        page.locator(".timings", has_text="background job").wait_for()

        record = _js(page, "window.uniunConsole.chat.log.at(-1)")
        assert record["error"] is None and not record["stopped"], record
        assert record["tokens"] >= 2 and record["text"]
        grew = sorted({n for n in _js(page, "window.__lengths") if n > 0})
        assert len(grew) >= 2, f"the answer arrived in one piece: {grew}"
        bubble = page.locator(".msg.assistant").last.text_content()
        assert bubble == record["text"]
        chat = record["job_id"]

        # The timeline: the background job preempted for this chat, then resumed.
        preempt = wait_for("the preemption on the page", lambda: _marks(page, "preempt", bg))
        assert chat in preempt[0]["detail"]
        wait_for("the resume on the page", lambda: _marks(page, "resume", bg))
        timings = page.locator(".timings").last.text_content()
        assert "paused 1 background job" in timings, timings
        # ... and drawn on the canvas (what the last frame drew, for hovering).
        drawn = _js(page, "window.uniunConsole.timeline.items.filter(i => i.type === 'mark'"
                          f" && i.m.job_id === {bg!r}).map(i => i.m.what)")
        assert "preempt" in drawn and "resume" in drawn, drawn
        runs = _js(page, f"window.uniunConsole.live.segments.filter(s => s.job_id === {bg!r} "
                         "&& s.lane === 'run')")
        assert runs and runs[0]["reason"] == "preempted" and runs[0]["kind"] == "nataraj"
        chats = _js(page, f"window.uniunConsole.live.segments.filter(s => s.job_id === "
                          f"{chat!r} && s.lane === 'run')")
        assert chats and chats[0]["tier"] == 0 and chats[0]["reason"] == "done"
        # Hovering the mark says which job stopped, and for whom (a 2-minute window: the
        # mark moves less than its glyph's width between finding it and pointing at it).
        page.click("#window-buttons button[data-window='120']")
        page.wait_for_timeout(300)
        spot = _js(page, "(() => { const i = window.uniunConsole.timeline.items.find(i => "
                         f"i.type === 'mark' && i.m.what === 'preempt' && i.m.job_id === {bg!r});"
                         " return {x: (i.x0 + i.x1) / 2, y: i.y0 + 5}; })()")
        box = page.locator("#timeline canvas").bounding_box()
        page.mouse.move(box["x"] + spot["x"], box["y"] + spot["y"])
        tip = page.locator("#tip")
        tip.wait_for()
        assert bg in tip.text_content() and chat in tip.text_content()

        # Cancelled from the device panel while it runs again.
        page.locator("#running code", has_text=bg).wait_for()
        page.click(f"#running button[title='cancel {bg}']")
        wait_for("the cancelled segment", lambda: _js(
            page, f"window.uniunConsole.live.segments.some(s => s.job_id === {bg!r} "
                  "&& s.lane === 'run' && s.reason === 'cancelled')"))
        page.locator("#running", has_text="idle").wait_for()
        assert seen["errors"] == []
        assert all(url.startswith(base_url) for url in seen["requests"]), seen["requests"]
    finally:
        ctx.close()


def test_the_console_fits_a_phone_and_weighs_little(chromium: Any, base_url: str) -> None:
    ctx, page, seen = _open(chromium, base_url, viewport={"width": 390, "height": 844},
                            is_mobile=True, has_touch=True, device_scale_factor=2)
    try:
        assert all(url.startswith(base_url) for url in seen["requests"]), seen["requests"]
        weight = sum(len(r.body()) for r in seen["responses"]
                     if "/console/api/events" not in r.url and r.status == 200)
        assert 0 < weight <= PAGE_WEIGHT_MAX, weight
        assert _js(page, "document.documentElement.scrollWidth") <= 390
        for panel in PANELS:  # every panel reachable from the top bar, and within the width
            page.click(f"nav.jump a[href='#{panel}']")
            box = page.locator(f"#{panel}").bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, panel
            assert page.locator(f"#{panel}").is_visible()
            top = _js(page, f"document.getElementById({panel!r}).getBoundingClientRect().top")
            assert 0 <= top < 844, (panel, top)
        assert _js(page, "document.documentElement.scrollWidth") <= 390
        assert seen["errors"] == []
    finally:
        ctx.close()


def test_controls_reach_the_scheduler_and_come_back_on_the_feed(
        chromium: Any, base_url: str) -> None:
    ctx, page, _ = _open(chromium, base_url, viewport={"width": 1280, "height": 900})
    try:
        page.select_option("#fg-kind", "extract")
        page.locator("#queues", has_text="foreground kind: extract").wait_for()
        for label in TIER_LABELS:  # as the policy declares them: the feed carries them
            page.locator("#queues .tier", has_text=label).wait_for()
        page.click("#lifecycle button[data-state='background']")
        page.locator("#summary", has_text="app background").wait_for()
        page.click("#lifecycle button[data-state='foreground']")
        page.locator("#summary", has_text="app foreground").wait_for()
        page.select_option("#fg-kind", "")
        page.locator("#queues", has_text="no foreground kind").wait_for()
        page.fill("#cancel-id", "no-such-job")
        page.click("#cancel-form button[type=submit]")
        page.locator("#control-out.bad", has_text="no-such-job").wait_for()
        page.click("#result-tabs button[data-kind='card']")
        page.locator("#result-list", has_text="No cards yet").wait_for()
        # Stop: the answer ends where it was, and its job is cancelled in the runtime.
        page.click("#chat details.settings summary")
        page.fill("#max-tokens", str(BG_TOKENS))
        page.fill("#prompt", "Tell me a long story.")
        page.press("#prompt", "Enter")
        wait_for("the first tokens", lambda: _js(
            page, "(window.uniunConsole.chat.log.at(-1) || {}).tokens >= 2"))
        page.click("#stop")
        page.locator(".msg.assistant", has_text="(stopped)").wait_for()
        record = _js(page, "window.uniunConsole.chat.log.at(-1)")
        assert record["stopped"] and record["tokens"] < BG_TOKENS
        wait_for("the stopped chat's run to end cancelled", lambda: _js(
            page, f"window.uniunConsole.live.segments.some(s => s.job_id === "
                  f"{record['job_id']!r} && s.lane === 'run' && s.reason === 'cancelled')"))
    finally:
        ctx.close()


def test_new_results_appear_in_the_page_as_they_land(
        chromium: Any, tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> None:
    """The Nataraj producer keeps a deck of cards; taking cards (as ``deck --take`` does)
    makes it write new ones, and the open page shows them without being reloaded."""
    from uniun.actors.producers.results import ResultsStore

    config = CONFIG.replace("nataraj = false", "nataraj = true\nsamples = false")
    with serving(tmp_path_factory.mktemp("rt-console-results"), config,
                 "scheduler,runner,http,nataraj") as runtime:
        ctx, page, seen = _open(chromium, runtime.gateway_url(),
                                viewport={"width": 1280, "height": 900})
        try:
            page.click("#result-tabs button[data-kind='card']")
            page.locator("#result-list .result").first.wait_for()
            before = page.locator("#result-list .result").count()
            with ResultsStore(runtime.home / "results.db") as store:
                taken = store.take_cards(100)
            assert taken
            wait_for("new cards in the page", lambda: page.locator(
                "#result-list .result").count() > before)
            page.locator("#result-list .result", has_text="taken").first.wait_for()
            assert seen["errors"] == []
        finally:
            ctx.close()


def test_a_chaos_round_from_the_console_kills_the_runner_once_and_passes(
        rt: Runtime, base_url: str) -> None:
    headers = {"Content-Type": "application/json"}
    runner = rt.pid("runner")
    with httpx.Client(base_url=base_url, timeout=30) as http:
        started = http.post("/console/api/chaos", json={}, headers=headers)
        assert started.status_code == 202, started.text
        assert started.json()["state"] == "running"
        again = http.post("/console/api/chaos", json={})
        assert again.status_code == 409 and again.json()["error"]["code"] == "chaos_running"

        def ended() -> dict[str, Any] | None:
            view = http.get("/console/api/chaos").json()
            return view if view["state"] != "running" else None

        view = wait_for("the chaos round's verdict", ended, timeout=600)
        assert view["state"] == "passed", view
        verdict = view["verdict"]
        assert verdict["ok"] and verdict["faults_by_kind"] == {"kill:runner": 1}
        assert verdict["jobs"]["lost"] == 0 and verdict["jobs"]["duplicated"] == 0
        assert verdict["runtime_alive"]
        assert rt.pid("runner") != runner  # the supervisor replaced the killed runner
        too_soon = http.post("/console/api/chaos", json={})
        assert too_soon.status_code == 429
        assert too_soon.json()["error"]["code"] == "chaos_too_soon"
    assert Path(rt.home / "run" / "console-chaos.json").is_file()
