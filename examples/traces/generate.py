"""Writes the example traces of this folder (deterministic: fixed seeds).

    .venv/bin/python examples/traces/generate.py

busy_phone.jsonl  -- 20 minutes of a busy phone on one model: a 500-note extract backfill
                     (one job a second), Nataraj keeping its deck filled, two cron Ganas
                     with their own flows and deadlines, chats arriving in bursts, the user
                     visiting the Nataraj deck and a note, a spell in the background.
multi_model.jsonl -- 15 minutes, three models, a runner slightly over-loaded: chat,
                     extract backfill and Nataraj on the chat model, one Gana firing
                     every 20 s on a second model, one every 40 s on a third, chats in
                     bursts, a minute on the Gana form.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHAT_MODEL = "smollm2-135m-instruct"


def job(job_id: str, kind: str, prompt_tokens: int, new_tokens: int, **extra: object) -> dict:
    body = {"job_id": job_id, "kind": kind, "prompt": f"<{prompt_tokens} tokens>",
            "max_new_tokens": max(new_tokens, extra.pop("max_new_tokens", 0) or 0)}
    body.update(extra)
    body["prompt_tokens"] = prompt_tokens
    body["new_tokens"] = new_tokens
    return body


def chats(rng: random.Random, bursts: list[tuple[float, int]], prefix: str,
          **extra: object) -> list[tuple[float, dict]]:
    out = []
    for n, (start, count) in enumerate(bursts):
        t = start
        for i in range(count):
            out.append((round(t, 2), {"event": "submit", "job": job(
                f"{prefix}{n}-{i}", "chat", rng.randint(60, 400), rng.randint(20, 120),
                messages=None, **extra)}))
            t += rng.uniform(8, 25)  # the user reads the answer, types the next one
    for _, ev in out:
        ev["job"].pop("messages")
    return out


def cron(name: str, model: str | None, period: float, until: float, prompt: int, new: int,
         lateness: float, first: float) -> list[tuple[float, dict]]:
    out, t, n = [], first, 0
    while t < until:
        extra: dict[str, object] = {"flow": f"gana:{name}", "deadline": round(t + lateness, 2)}
        if model:
            extra["model_id"] = model
        out.append((round(t, 2), {"event": "submit", "job": job(
            f"gana-{name}-{n}", "gana", prompt, new, **extra)}))
        t += period
        n += 1
    return out


def write(name: str, events: list[tuple[float, dict]]) -> None:
    events.sort(key=lambda e: e[0])
    with open(HERE / name, "w", encoding="utf-8") as fh:
        for t, body in events:
            fh.write(json.dumps({"t": t, **body}) + "\n")


def busy_phone() -> None:
    rng = random.Random(118)
    ev: list[tuple[float, dict]] = []
    for i in range(500):  # backfill: one note a second
        ev.append((float(5 + i), {"event": "submit", "job": job(
            f"extract-{i}", "extract", rng.randint(200, 500), rng.randint(40, 100))}))
    t, n = 2.0, 0
    while t < 1150:  # Nataraj keeps its deck filled
        ev.append((round(t, 2), {"event": "submit", "job": job(
            f"nataraj-{n}", "nataraj", rng.randint(150, 300), rng.randint(150, 250))}))
        t += rng.uniform(15, 30)
        n += 1
    ev += cron("weather", None, 60.0, 1150, 400, 150, 30.0, 10.0)
    ev += cron("digest", None, 90.0, 1150, 600, 300, 60.0, 25.0)
    ev += chats(rng, [(60, 6), (300, 5), (620, 8), (1050, 4)], "chat-")
    # The user opens the Nataraj deck, then a note (extract for it, foreground hint).
    ev.append((400.0, {"event": "foreground", "kind": "nataraj"}))
    ev.append((470.0, {"event": "foreground", "kind": None}))
    ev.append((560.0, {"event": "foreground", "kind": "extract"}))
    ev.append((560.5, {"event": "submit", "job": job(
        "extract-opened-note", "extract", 450, 90, foreground_hint=True)}))
    ev.append((600.0, {"event": "foreground", "kind": None}))
    # Two chats and a Nataraj card are abandoned by the user.
    ev.append((75.0, {"event": "cancel", "job_id": "chat-0-0"}))
    ev.append((250.0, {"event": "cancel", "job_id": "nataraj-5"}))
    # The app goes to the background for two minutes.
    ev.append((850.0, {"event": "lifecycle", "state": "background"}))
    ev.append((970.0, {"event": "lifecycle", "state": "foreground"}))
    write("busy_phone.jsonl", ev)


def multi_model() -> None:
    rng = random.Random(7)
    ev: list[tuple[float, dict]] = []
    for i in range(400):  # backfill on the chat model, one note every two seconds
        ev.append((float(5 + 2 * i), {"event": "submit", "job": job(
            f"extract-{i}", "extract", rng.randint(200, 500), rng.randint(40, 100))}))
    t, n = 3.0, 0
    while t < 850:
        ev.append((round(t, 2), {"event": "submit", "job": job(
            f"nataraj-{n}", "nataraj", rng.randint(150, 300), rng.randint(150, 250))}))
        t += rng.uniform(20, 40)
        n += 1
    # Two Ganas on their own models, firing often, with generous deadlines.
    ev += cron("planner", "qwen2.5-0.5b-instruct", 20.0, 850, 300, 80, 240.0, 12.0)
    ev += cron("summary", "phi-3-mini", 40.0, 850, 500, 120, 240.0, 30.0)
    ev += chats(rng, [(40, 5), (200, 6), (420, 5), (700, 6)], "chat-")
    # The user opens the Gana form for a minute: Gana work is foreground (T1).
    ev.append((500.0, {"event": "foreground", "kind": "gana"}))
    ev.append((560.0, {"event": "foreground", "kind": None}))
    write("multi_model.jsonl", ev)


if __name__ == "__main__":
    busy_phone()
    multi_model()
