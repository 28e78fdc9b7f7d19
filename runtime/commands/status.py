"""``uniun-runtime status``: the scheduler's ``status`` (docs/protocol.md) as a table, or JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from uniun.runtime.commands.common import add_connection_args, client_command, connect
from uniun.runtime.paths import run_dir
from uniun.runtime.state import HTTP_ENDPOINT_FILE


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "status", help="show what the runtime is doing (queues, running job, processes)",
        description="Ask the scheduler for its status: policy, lifecycle, foreground kind, "
                    "loaded model, running job, queues per tier in pick order, vruntime "
                    "per flow, T2 share, parked snapshots and process ids.")
    parser.add_argument("--json", action="store_true", help="print the raw status as JSON")
    parser.add_argument("--watch", action="store_true",
                        help="print a plain-text frame of `top` every --interval seconds "
                             "(for terminals and logs where the live view does not fit)")
    parser.add_argument("--interval", type=float, default=2.0, metavar="S",
                        help="seconds between --watch frames (default 2)")
    add_connection_args(parser)
    parser.set_defaults(func=run)


@client_command
def run(args: argparse.Namespace) -> int:
    if args.watch:
        from uniun.runtime.commands.top import watch_plain

        return watch_plain(args)
    with connect(args) as client:
        status = client.status()
        endpoint = client.endpoint
    http = _http_endpoint()
    if http:
        status.setdefault("http", http)  # the gateway's base URL (run/http.endpoint)
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True, default=str))
        return 0
    Console().print(render(status, endpoint))
    return 0


def render(status: dict[str, Any], endpoint: str) -> Table:
    """The status as a two-column table; unknown extra keys are shown too."""
    table = Table(title="UNIUN runtime", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    shown = ("http", "policy", "lifecycle", "foreground", "loaded_model", "running", "queues",
             "vruntime", "t2_share", "snapshots", "processes", "ready", "process_info",
             "poisoned", "quarantined", "dead_letters")
    table.add_row("front", endpoint)
    table.add_row("ready", "yes: a chat is answered now" if status.get("ready")
                  else "no: the runner is not up with a model yet")
    table.add_row("http", _text(status.get("http")) if status.get("http") else "off")
    table.add_row("policy", _text(status.get("policy")))
    table.add_row("lifecycle", _text(status.get("lifecycle")))
    table.add_row("foreground", _text(status.get("foreground")) if status.get("foreground")
                  else "none")
    table.add_row("loaded model", _text(status.get("loaded_model")))
    table.add_row("running", _running(status.get("running")))
    table.add_row("queues", _queues(status.get("queues")))
    table.add_row("vruntime", _mapping(status.get("vruntime"), fmt="{:.3f} s"))
    share = status.get("t2_share")
    table.add_row("T2 share", f"{share:.0%}" if isinstance(share, (int, float)) else "-")
    table.add_row("snapshots", _snapshots(status.get("snapshots")))
    table.add_row("processes", _processes(status))
    table.add_row("poisoned", _poisoned(status.get("poisoned")))
    if status.get("quarantined"):
        table.add_row("quarantined", _quarantined(status["quarantined"]))
    if status.get("dead_letters"):
        table.add_row("dead letters", _dead_letters(status["dead_letters"]))
    for key in sorted(set(status) - set(shown)):
        table.add_row(key, _text(status[key]))
    return table


def _processes(status: dict[str, Any]) -> str:
    """``name pid N (priority)`` per process: the CPU priority is docs/device.md's."""
    info = status.get("process_info") or {}
    procs = status.get("processes") or {}
    if not isinstance(procs, dict) or not procs:
        return "-"
    return ", ".join(f"{name} pid {pid}" + (f" ({info[name]['priority']})"
                                             if isinstance(info.get(name), dict)
                                             and info[name].get("priority") else "")
                     for name, pid in sorted(procs.items()))


def _http_endpoint() -> str | None:
    """The OpenAI-compatible gateway's base URL, if it is serving."""
    try:
        return (run_dir() / HTTP_ENDPOINT_FILE).read_text().strip() or None
    except OSError:
        return None


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def _running(job: Any) -> str:
    if not job:
        return "idle"
    if not isinstance(job, dict):
        return _text(job)
    head = str(job.get("job_id", "?"))
    details = [f"{k} {job[k]}" for k in ("kind", "tier", "flow", "model_id") if k in job]
    for key in ("tokens", "completion_tokens", "generated"):
        if key in job:
            details.append(f"{job[key]} tokens")
            break
    return f"{head} ({', '.join(details)})" if details else head


def _queues(queues: Any) -> str:
    if not isinstance(queues, dict) or not queues:
        return "empty" if isinstance(queues, dict) else _text(queues)
    lines = []
    for tier, ids in queues.items():
        ids = list(ids or [])
        more = f" … +{len(ids) - 5}" if len(ids) > 5 else ""
        lines.append(f"{tier}: {len(ids)} " + (f"[{', '.join(map(str, ids[:5]))}{more}]"
                                              if ids else ""))
    return "\n".join(lines)


def _mapping(value: Any, *, fmt: str) -> str:
    if not isinstance(value, dict):
        return _text(value)
    if not value:
        return "-"
    out = []
    for key, item in value.items():
        try:
            out.append(f"{key}: {fmt.format(item)}")
        except (ValueError, TypeError):
            out.append(f"{key}: {item}")
    return "\n".join(out)


def _poisoned(value: Any) -> str:
    """Dead-lettered jobs (error ``poisoned``): each killed the runner 3 times in a row."""
    if not isinstance(value, list):
        return _text(value) if value is not None else "none"
    if not value:
        return "none"
    return "\n".join(f"{p.get('job_id')} ({p.get('kind')})" if isinstance(p, dict)
                     else _text(p) for p in value)


def _quarantined(value: Any) -> str:
    """Databases found corrupt at start and moved aside (runtime/quarantine.py)."""
    if not isinstance(value, list):
        return _text(value)
    return "\n".join(f"{q.get('file')} was corrupt ({q.get('reason')}); moved to "
                     f"{q.get('moved_to')}" if isinstance(q, dict) else _text(q)
                     for q in value)


def _dead_letters(value: Any) -> str:
    """Acknowledged jobs the journal replay could not use, moved aside with the reason
    (actors/scheduler/journal.py): the count, then the newest few."""
    if not isinstance(value, dict):
        return _text(value)
    lines = [f"{value.get('count')} kept in journal.db (table dead_letters)"]
    lines += [f"{d.get('job_id')} ({d.get('kind') or '?'}): {d.get('reason')}"
              if isinstance(d, dict) else _text(d) for d in value.get("recent") or []]
    return escape("\n".join(lines))  # a reason says "[jobs] kinds": not rich markup


def _snapshots(value: Any) -> str:
    if isinstance(value, dict) and "count" in value:
        size = value.get("bytes", 0)
        mib = size / 2**20 if isinstance(size, (int, float)) else 0
        return f"{value['count']} parked, {mib:.1f} MiB"
    return _text(value)
