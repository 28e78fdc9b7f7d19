"""Ganas: their definitions (``$UNIUN_HOME/ganas.toml``) and the fire-time arithmetic.

No I/O beyond reading the TOML text, no clock: ``now`` is always passed in, so the
schedule math is tested with plain numbers.

Theory of operation. A Gana fires on a grid of *slots* ``last + k * every``. The next
slot to fire is the **latest** grid slot that is due, so a Gana whose fires were missed
while the runtime was down fires once on start, not once per missed interval; the grid
then continues from that slot. A Gana that never fired is due at once, for the slot
``now + lead_s``.
A slot is *due* ``lead_s`` seconds before its time: gana-cron submits it early with
``deadline`` = the slot, so it runs in the fair pool (T4) and is promoted to T3 (EDF)
only if it has not run by its fire time. Who fires a slot (gana-cron or the
background-Gana process) is settled by a claim in the results database; both use
:func:`due_slot` on the last *claimed* slot inside the claiming transaction.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uniun.actors.producers.ids import unguessable_id
from uniun.protocol.errors import InvalidField
from uniun.protocol.tools import canonical, parse_tool_choice, parse_tools

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

GANA_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
DEFAULT_MAX_NEW_TOKENS = 128
_KEYS = frozenset({"id", "prompt", "every_minutes", "model_id", "max_new_tokens", "system",
                   "style", "tools", "tool_choice"})
STYLES = ("chat", "completion")


class GanaConfigError(ValueError):
    """ganas.toml is not valid; the message names the Gana and the field."""


@dataclass(frozen=True)
class GanaDef:
    """One user-defined agent task."""

    id: str
    prompt: str
    every_minutes: float
    model_id: str | None = None  # None: the runtime's configured chat model
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    system: str | None = None  # optional system message
    # "completion": ``prompt`` is sent as raw text (few-shot text for a base model such as
    # Gemma 3 270M, which has no chat template); "chat" (default): as a user message.
    style: str = "chat"
    # Functions the Gana's model may call, as the job map's ``tools`` (docs/protocol.md),
    # kept as JSON text (a frozen definition); the run's text is then the call.
    tools_json: str | None = None
    tool_choice: Any = None  # none, auto, required or {"name": ...}; default auto

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        return json.loads(self.tools_json) if self.tools_json is not None else None

    @property
    def every_s(self) -> float:
        return self.every_minutes * 60.0


def parse_ganas(data: dict[str, Any], *, source: str = "ganas.toml") -> list[GanaDef]:
    """Ganas from a parsed TOML document with ``[[gana]]`` tables."""
    unknown_top = set(data) - {"gana"}
    if unknown_top:
        raise GanaConfigError(f"{source}: unknown top-level key {sorted(unknown_top)[0]!r}"
                              " (Ganas are [[gana]] tables)")
    items = data.get("gana", [])
    if not isinstance(items, list):
        raise GanaConfigError(f"{source}: 'gana' must be an array of tables ([[gana]])")
    out: list[GanaDef] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        where = f"{source}: gana #{i + 1}"
        if not isinstance(item, dict):
            raise GanaConfigError(f"{where}: must be a table")
        gid = item.get("id")
        if not isinstance(gid, str) or not GANA_ID_RE.match(gid):
            raise GanaConfigError(f"{where}: id must be 1-64 of letters, digits, '_', '-', '.'")
        where = f"{source}: gana {gid!r}"
        if gid in seen:
            raise GanaConfigError(f"{where}: id is used twice")
        seen.add(gid)
        unknown = set(item) - _KEYS
        if unknown:
            raise GanaConfigError(f"{where}: unknown field {sorted(unknown)[0]!r}")
        prompt = item.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise GanaConfigError(f"{where}: prompt must be a non-empty string")
        every = item.get("every_minutes")
        if (not isinstance(every, (int, float)) or isinstance(every, bool)
                or not math.isfinite(every) or every <= 0):
            raise GanaConfigError(f"{where}: every_minutes must be a number > 0")
        model_id = item.get("model_id")
        if model_id is not None and (not isinstance(model_id, str) or not model_id):
            raise GanaConfigError(f"{where}: model_id must be a non-empty string")
        max_new = item.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 1:
            raise GanaConfigError(f"{where}: max_new_tokens must be an integer >= 1")
        system = item.get("system")
        if system is not None and not isinstance(system, str):
            raise GanaConfigError(f"{where}: system must be a string")
        style = item.get("style", "chat")
        if style not in STYLES:
            raise GanaConfigError(f"{where}: style must be one of {', '.join(STYLES)}")
        tools_json, choice = _tools(item, where, style)
        out.append(GanaDef(gid, prompt, float(every), model_id, max_new, system, style,
                           tools_json, choice))
    return out


def _tools(item: dict[str, Any], where: str, style: str) -> tuple[str | None, Any]:
    """A Gana's ``tools`` and ``tool_choice``, checked as the job map checks them."""
    if item.get("tools") is None:
        if item.get("tool_choice") is not None:
            raise GanaConfigError(f"{where}: tool_choice needs tools")
        return None, None
    if style != "chat":
        raise GanaConfigError(f"{where}: tools need style chat (the model sees them in "
                              "its chat template)")
    try:
        tools = parse_tools(item["tools"])
        choice, name = parse_tool_choice(item.get("tool_choice"), {t["name"] for t in tools})
    except InvalidField as err:
        raise GanaConfigError(f"{where}: {err.message}") from None
    return canonical(tools, sort_keys=False), {"name": name} if name else choice


def load_ganas(path: Path) -> list[GanaDef]:
    """Ganas from a file; a missing file means no Ganas."""
    if not path.exists():
        return []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise GanaConfigError(f"{path}: not valid TOML: {err}") from err
    return parse_ganas(data, source=str(path))


def due_slot(last_slot: float | None, every_s: float, now: float,
             lead_s: float = 0.0) -> float | None:
    """The slot to fire now, or None if none is due.

    A slot ``s`` is due once ``now >= s - lead_s``. ``last_slot`` is the last slot fired
    (claimed) for this Gana, None if it never fired. Missed slots collapse into the latest
    one: after a long downtime this returns one slot, the most recent grid slot that is due.
    """
    if every_s <= 0:
        raise ValueError("every_s must be > 0")
    if last_slot is None:
        return now + lead_s
    k = math.floor((now + lead_s - last_slot) / every_s)
    if k < 1:
        return None
    return last_slot + k * every_s


def next_slot(last_slot: float | None, every_s: float, now: float) -> float:
    """When the next slot is (for display and for sleeping until it)."""
    if last_slot is None:
        return now
    k = max(1, math.floor((now - last_slot) / every_s) + 1)
    return last_slot + k * every_s


def fire_job_id(gana_id: str, slot: float) -> str:
    """The job id of one fire: the Gana and the slot, and a random tag so that no other
    client can take it first. Made once, when the slot is claimed; the claim keeps it,
    so the fire keeps its id across restarts (``results_fires``)."""
    return unguessable_id(f"gana-{gana_id}-{round(slot * 1000)}")


def gana_messages(gana: GanaDef) -> list[dict[str, str]]:
    messages = [] if gana.system is None else [{"role": "system", "content": gana.system}]
    messages.append({"role": "user", "content": gana.prompt})
    return messages


def gana_completion_prompt(gana: GanaDef) -> str:
    """A completion-style Gana's raw prompt: its system text (if any), then the prompt."""
    return gana.prompt if gana.system is None else f"{gana.system}\n\n{gana.prompt}"


def gana_job(gana: GanaDef, *, job_id: str, deadline: float | None,
             max_new_tokens_cap: int | None = None) -> dict[str, Any]:
    """The wire job map of one Gana run (``flow`` = its id, so Ganas share fairly)."""
    max_new = gana.max_new_tokens
    if max_new_tokens_cap is not None:
        max_new = min(max_new, max_new_tokens_cap)
    job: dict[str, Any] = {
        "job_id": job_id, "kind": "gana", "max_new_tokens": max_new, "deadline": deadline,
        "flow": gana.id,
    }
    if gana.style == "completion":
        job["prompt"] = gana_completion_prompt(gana)
    else:
        job["messages"] = gana_messages(gana)
    if gana.model_id is not None:
        job["model_id"] = gana.model_id
    if gana.tools_json is not None:
        job["tools"] = gana.tools
        job["tool_choice"] = gana.tool_choice
    return job
