"""Benchmark: the console's goals, measured with a real page (``uniun-runtime bench --console``).

One runtime over a temporary home (the shared model store; producers and the embedding
pool off, so the times are the chat's and the console's), its gateway on a free port, and
headless Chromium (the system's; ``runtime/bench/browser.py``). The goals (docs/console.md):

| measure | goal |
|---|---|
| a preemption appears on the page's timeline after it happened on the runner | <= 0.5 s |
| chat time to first token typed in the page vs the same chat over the API, idle | <= 1.2x |
| the runtime's chat TTFT with the console open and streaming, vs closed | <= 1.05x |
| page weight, first load, nothing fetched outside the runtime | <= 300 KB |
| the console at 390 px wide: no horizontal scrolling, every panel reachable | usable |

Results go to a JSON file (``--out``), each goal with what was measured and whether it
held; ``--shots DIR`` also saves screenshots of the console in the middle of a preemption.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from uniun.runtime.bench import console_measures as cm
from uniun.runtime.bench.browser import browser, why_no_browser
from uniun.runtime.bench.launch import launched

__all__ = ["GOALS", "run"]

Log = Callable[[str], None]
GOALS = {"preempt_on_page_s": 0.5, "ttft_page_over_api": 1.2,
         "runtime_ttft_open_over_closed": 1.05, "page_weight_bytes": 300 * 1024}
CONFIG = ('[models]\nchat_model = "{model}"\n'
          "[producers]\nextract = false\nnataraj = false\ngana = false\n"
          "background_gana = false\n[embed]\nenabled = false\n[http]\nport = 0\n")
START_WAIT_S = 600.0
IDLE_CLOSE_S = 10.0  # actors/gateway/console_hub.py: the watch closes this long after


@contextlib.contextmanager
def own_runtime(model: str, log: Log) -> Iterator[tuple[str, str]]:
    """A runtime of the bench's own; yields (gateway base URL, front endpoint)."""
    with tempfile.TemporaryDirectory(prefix="uniun-bench-console-", dir="/tmp") as tmp:
        home = Path(tmp)
        with launched(home, CONFIG.format(model=model)) as proc:
            endpoint = home / "run" / "http.endpoint"
            front = f"ipc://{home / 'run' / 'front.sock'}"
            deadline = time.monotonic() + START_WAIT_S
            while not (endpoint.exists() and endpoint.read_text().strip()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the runtime did not start: "
                                       + (home / "start.out").read_text()[-2000:])
                time.sleep(0.2)
            url = endpoint.read_text().strip()
            _ready(front, deadline)
            log(f"console bench: runtime up, console at {url}/ (model {model})")
            yield url, front


def _ready(front: str, deadline: float) -> None:
    from uniun.protocol.client import Client

    with Client(front, timeout=30) as client:
        while not client.status(timeout=30).get("ready"):
            if time.monotonic() > deadline:
                raise RuntimeError("the runtime did not become ready")
            time.sleep(0.2)


def run(model: str, reps: int, log: Log, shots: Path | None = None,
        blocks: int = 4) -> dict[str, Any]:
    """Measure every goal; see the module docstring."""
    why = why_no_browser()
    if why is not None:
        raise RuntimeError(f"the console bench needs a browser: {why}")
    result: dict[str, Any] = {"model": model, "reps": reps, "blocks": blocks, "goals": {}}
    with own_runtime(model, log) as (url, front), browser() as chromium:
        result["browser"] = chromium.version
        result["page_weight"] = cm.page_weight(chromium, url)
        log(f"console bench: first load {result['page_weight']['bytes']} bytes")
        result["phone"] = cm.phone_usability(chromium, url)
        log(f"console bench: 390 px usable: {result['phone']['usable']}")
        result["preempt_latency"] = cm.preempt_latency(chromium, url, front, reps, log)
        result["ttft_page_vs_api"] = cm.ttft_page_vs_api(chromium, url, model, reps, log)
        result["runtime_ttft_open_vs_closed"] = cm.runtime_ttft_open_vs_closed(
            chromium, url, front, reps, blocks, IDLE_CLOSE_S, log)
        if shots is not None:
            result["screenshots"] = cm.screenshots(chromium, url, front, shots, log)
    result["goals"] = goals(result)
    return result


def goals(result: dict[str, Any]) -> dict[str, Any]:
    """Each goal: the measured value (the median where there are several), the goal, and
    whether it held."""
    weight = result["page_weight"]
    measured = {
        "preempt_on_page_s": result["preempt_latency"]["from_mark_s"]["p50"],
        "ttft_page_over_api": result["ttft_page_vs_api"]["ratio_p50"],
        "runtime_ttft_open_over_closed": result["runtime_ttft_open_vs_closed"]["ratio_p50"],
        "page_weight_bytes": weight["bytes"],
    }
    out: dict[str, Any] = {name: {"measured": value, "goal": GOALS[name],
                                  "met": value <= GOALS[name]}
                           for name, value in measured.items()}
    out["preempt_on_page_s"]["max"] = result["preempt_latency"]["from_mark_s"]["max"]
    out["preempt_on_page_s"]["met"] = result["preempt_latency"]["from_mark_s"]["max"] \
        <= GOALS["preempt_on_page_s"]
    out["page_weight_bytes"]["met"] = out["page_weight_bytes"]["met"] \
        and not weight["requests_outside_the_runtime"]
    out["phone_390px_usable"] = {"measured": result["phone"]["usable"], "goal": True,
                                 "met": bool(result["phone"]["usable"])}
    return out
