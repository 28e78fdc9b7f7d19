"""One frame of ``uniun-runtime top``, built from a ``status`` reply (pure, no I/O).

Kept apart from the command so that a frame can be rendered from a recorded status
without a terminal (the snapshot test does) and reused as the plain-text fallback
(``status --watch``). A frame shows, top to bottom: who serves (endpoint, policy,
lifecycle, foreground, model, runner), the running job, the queue of each tier with its
next jobs, vruntime per flow, the T2 share against its budget, parked snapshots, each
process, and the recent events (preempt, resume, swap, restarts).

Width: at 100 columns and more the vruntime and process tables sit side by side; below
that everything stacks; below 60 the tables give way to short lines, so a phone-sized
terminal still reads.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from uniun.actors.policy.tiers import TIER_LABELS, TIER_NAMES

__all__ = ["Rates", "render_frame", "frame_text", "down_frame", "WIDE", "NARROW"]

WIDE = 100  # columns from which tables sit side by side
NARROW = 60  # columns below which tables become lines
NEXT_SHOWN = 3  # queued job ids shown per tier


@dataclass
class Rates:
    """Frame-to-frame memory: tokens/s of the running job and restarts seen, so the live
    view shows a rate over the last refresh and turns a restart count that went up into
    an event line. ``--once`` uses a fresh one (tokens per runner second instead)."""

    job_id: str | None = None
    tokens: int = 0
    at: float = 0.0
    rate: float | None = None
    restarts: dict[str, int] = field(default_factory=dict)
    restart_events: list[dict[str, Any]] = field(default_factory=list)

    def update(self, status: dict[str, Any], now: float) -> None:
        running = status.get("running") or {}
        job, tokens = running.get("job_id"), int(running.get("tokens") or 0)
        if job is not None and job == self.job_id and now - self.at >= 0.2:
            self.rate = max(0.0, (tokens - self.tokens) / (now - self.at))
            self.tokens, self.at = tokens, now
        elif job != self.job_id:
            self.job_id, self.tokens, self.at, self.rate = job, tokens, now, None
        for name, info in (status.get("process_info") or {}).items():
            count = int((info or {}).get("restarts") or 0)
            if count > self.restarts.get(name, count):
                self.restart_events.append({"what": "restart", "at": time.time(),
                                            "job_id": None, "detail": f"{name} (#{count})"})
            self.restarts[name] = count
        del self.restart_events[:-8]


def render_frame(status: dict[str, Any], *, endpoint: str, width: int, now: float,
                 rates: Rates | None = None) -> RenderableType:
    """The frame for ``status`` as a rich renderable, laid out for ``width`` columns."""
    narrow = width < NARROW
    parts: list[RenderableType] = [_header(status, endpoint, now), _running(status, rates)]
    if narrow:
        parts += [_lines_queues(status), _lines_flows(status), _snapshots(status),
                  _lines_processes(status), _lines_events(status, rates, now, limit=4)]
        return Group(*parts)
    parts += [_queues(status, width), Text(_t2(status)), _snapshots(status)]
    flows, procs = _flows(status), _processes(status)
    if width >= WIDE:
        grid = Table.grid(padding=(0, 2))
        grid.add_row(flows, procs)
        parts.append(grid)
    else:
        parts += [flows, procs]
    parts.append(_events(status, rates, now))
    return Group(*parts)


def frame_text(status: dict[str, Any], *, endpoint: str, width: int = WIDE,
               now: float | None = None, rates: Rates | None = None) -> str:
    """The frame as plain text (no colour, no terminal): ``top --once``, tests."""
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, force_terminal=False,
                      legacy_windows=False, emoji=False, highlight=False)
    console.print(render_frame(status, endpoint=endpoint, width=width,
                               now=time.time() if now is None else now, rates=rates))
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"


def down_frame(endpoint: str, since: float, error: str, now: float) -> RenderableType:
    """What the live view shows while nothing answers at ``endpoint``."""
    return Text.assemble(
        ("UNIUN top", "bold"), f"  {endpoint}\n",
        ("runtime not answering", "bold red"),
        f" for {now - since:.0f} s ({error}); retrying. Start it with: uniun-runtime start"
        "\nCtrl-C quits.")


# ---- pieces ---------------------------------------------------------------------------


def _header(status: dict[str, Any], endpoint: str, now: float) -> RenderableType:
    runner = status.get("runner") or {}
    up = f"up (pid {runner.get('pid')})" if runner.get("up") else "DOWN"
    clock = time.strftime("%H:%M:%S", time.localtime(now))
    line1 = Text.assemble(("UNIUN top", "bold"), f"  {clock}  {endpoint}")
    line2 = Text(f"policy {status.get('policy', '-')} · lifecycle "
                 f"{status.get('lifecycle', '-')} · foreground "
                 f"{status.get('foreground') or 'none'} · jobs "
                 f"{status.get('jobs', 0)}/{status.get('queue_cap', '-')}")
    line3 = Text(f"model {status.get('loaded_model') or '-'} · runner {up}")
    power = status.get("power")  # absent from an older scheduler's status: no line
    return Group(line1, line2, line3, *([Text(power_line(power))] if power else []))


def power_line(power: dict[str, Any]) -> str:
    """``power battery 15 % · nominal · background deadline_only (battery 15 % < 20 %)``."""
    battery = power.get("on_battery")
    where = "unknown" if battery is None else "battery" if battery else "charger"
    if power.get("percent") is not None:
        where += f" {power['percent']:.0f} %"
    return (f"power {where} · {power.get('thermal') or 'thermal unknown'} · background "
            f"{power.get('mode', '-')} ({power.get('reason', '-')})")


def _running(status: dict[str, Any], rates: Rates | None) -> RenderableType:
    job = status.get("running")
    if not job:
        return Text("running: idle")
    tokens = int(job.get("tokens") or 0)
    rate = rates.rate if rates is not None and rates.job_id == job.get("job_id") else None
    if rate is None and job.get("runner_s"):
        rate = tokens / float(job["runner_s"])
    stopping = f" · stopping ({job['stopping']})" if job.get("stopping") else ""
    return Text.assemble(("running: ", "bold"), (str(job.get("job_id")), "bold green"),
                         f" · {job.get('kind')} · T{job.get('tier')} · flow "
                         f"{job.get('flow')} · {tokens} tokens · "
                         f"{'-' if rate is None else f'{rate:.1f}'} tok/s{stopping}")


def _queue_rows(status: dict[str, Any]) -> list[tuple[str, int, list[str]]]:
    queues = status.get("queues") or {}
    held = list(status.get("held") or [])
    rows = []
    for name, label in zip(TIER_NAMES, TIER_LABELS):
        ids = [str(x) for x in queues.get(name) or []]
        rows.append((label, len(ids), ids))
    if held:
        rows.append(("held (background)", len(held), [str(x) for x in held]))
    return rows


def _queues(status: dict[str, Any], width: int) -> RenderableType:
    table = Table(title="queues", title_justify="left", box=box.SIMPLE_HEAD, expand=False,
                  padding=(0, 1))
    table.add_column("tier", no_wrap=True)
    table.add_column("waiting", justify="right")
    table.add_column("next", overflow="ellipsis", no_wrap=True,
                     max_width=max(20, width - 30))
    for label, count, ids in _queue_rows(status):
        more = f" +{count - NEXT_SHOWN}" if count > NEXT_SHOWN else ""
        table.add_row(label, str(count), ", ".join(ids[:NEXT_SHOWN]) + more)
    return table


def _lines_queues(status: dict[str, Any]) -> RenderableType:
    parts = [f"{label.split()[0]} {count}" for label, count, _ in _queue_rows(status)]
    return Text("queues: " + " · ".join(parts))


def _t2(status: dict[str, Any]) -> str:
    share, budget = status.get("t2_share"), status.get("t2_share_max")
    if not isinstance(share, (int, float)):
        return "T2 share -"
    of = f" of {budget:.0%} budget" if isinstance(budget, (int, float)) else ""
    blocked = " (over: waits)" if status.get("t2_blocked") else ""
    return f"T2 share: {share:.0%}{of}{blocked}"


def _flows(status: dict[str, Any]) -> RenderableType:
    table = Table(title="fair pool", title_justify="left",
                  box=box.SIMPLE_HEAD, padding=(0, 1))
    table.add_column("flow", overflow="ellipsis", no_wrap=True, max_width=24)
    table.add_column("vruntime", justify="right")
    floor = status.get("min_vruntime")
    for flow, value in sorted((status.get("vruntime") or {}).items()):
        table.add_row(str(flow), _num(value, "{:.3f} s"))
    if not status.get("vruntime"):
        table.add_row("-", "-")
    if isinstance(floor, (int, float)):
        table.caption = f"min {floor:.3f} s"
    return table


def _lines_flows(status: dict[str, Any]) -> RenderableType:
    flows = ", ".join(f"{k} {_num(v, '{:.1f}')}" for k, v in
                      sorted((status.get("vruntime") or {}).items())) or "-"
    return Text(f"{_t2(status)}\nvruntime: {flows}")


def _snapshots(status: dict[str, Any]) -> RenderableType:
    snaps = status.get("snapshots") or {}
    parking = status.get("parking") or {}
    mib = (snaps.get("bytes") or 0) / 2**20
    return Text(f"parked snapshots: {snaps.get('count', 0)} ({mib:.1f} MiB) · trimmed "
                f"{parking.get('trimmed', 0)} · spilled {parking.get('spilled', 0)} · "
                f"swaps {status.get('swaps', 0)} · preemptions {status.get('preemptions', 0)}")


def _process_rows(status: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    info = status.get("process_info") or {}
    pids = status.get("processes") or {}
    rows = []
    for name in sorted(set(info) | set(pids)):
        item = info.get(name) or {"pid": pids.get(name)}
        rss = item.get("rss_bytes")
        rows.append((name, str(item.get("pid") or "-"), _num(item.get("cpu_percent"), "{:.1f}"),
                     "-" if not isinstance(rss, (int, float)) else f"{rss / 2**20:.0f} MiB",
                     str(item.get("restarts", "-"))))
    return rows


def _processes(status: dict[str, Any]) -> RenderableType:
    table = Table(title="processes", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
    for name, justify in (("name", "left"), ("pid", "right"), ("cpu %", "right"),
                          ("rss", "right"), ("restarts", "right")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for row in _process_rows(status):
        table.add_row(*row)
    return table


def _lines_processes(status: dict[str, Any]) -> RenderableType:
    return Text("\n".join(f"{n} {pid} {cpu}% {rss} r{r}"
                          for n, pid, cpu, rss, r in _process_rows(status)) or "processes: -")


def _recent(status: dict[str, Any], rates: Rates | None) -> list[dict[str, Any]]:
    events = [e for e in status.get("events") or [] if isinstance(e, dict)]
    if rates is not None:
        events += rates.restart_events
    return sorted(events, key=lambda e: e.get("at") or 0)


def _events(status: dict[str, Any], rates: Rates | None, now: float,
            limit: int = 8) -> RenderableType:
    table = Table(title="recent events", title_justify="left", box=box.SIMPLE_HEAD,
                  padding=(0, 1))
    table.add_column("ago", justify="right", no_wrap=True, min_width=6)  # never squeezed to "0.…"
    table.add_column("what", no_wrap=True, min_width=7)
    table.add_column("job", overflow="ellipsis", no_wrap=True, max_width=28)
    table.add_column("detail", overflow="ellipsis", no_wrap=True)
    recent = _recent(status, rates)[-limit:]
    for e in reversed(recent):
        table.add_row(_ago(now, e.get("at")), str(e.get("what")), str(e.get("job_id") or "-"),
                      str(e.get("detail") or ""))
    if not recent:
        table.add_row("-", "none yet", "", "")
    return table


def _lines_events(status: dict[str, Any], rates: Rates | None, now: float,
                  limit: int) -> RenderableType:
    recent = _recent(status, rates)[-limit:]
    return Text("\n".join(f"{_ago(now, e.get('at'))} {e.get('what')} {e.get('job_id') or ''}"
                          for e in reversed(recent)) or "events: none yet")


def _ago(now: float, at: Any) -> str:
    if not isinstance(at, (int, float)):
        return "-"
    secs = max(0.0, now - at)
    return f"{secs:.1f}s" if secs < 60 else f"{secs / 60:.0f}m"


def _num(value: Any, fmt: str) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    return fmt.format(value)
