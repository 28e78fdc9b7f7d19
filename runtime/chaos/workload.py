"""The mixed workload: background jobs of several kinds, chats, clients that leave.

Every job comes from a *template* (its input and ``max_new_tokens``; all greedy), so
its text can be compared with a fault-free run of the same template: the harness runs
every template once before the first fault (:meth:`Workload.calibration`). While the
faults run, :meth:`Workload.tick` keeps ``background`` jobs in flight (kinds in turn:
``extract``, ``nataraj``, ``gana``) and one chat at a time, a new one every
``chat_every_s``; a chat cut off by a fault (``runner_failed``, retryable) is simply
followed by the next one, as a user would retry.

:meth:`Workload.disconnecting_client` is the "client that disconnects mid-stream"
fault: a second connection submits a job, reads its first token and closes; the main
connection then attaches to the job from ``seq`` 0, and the job must still end, with
every token, like any other.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

from uniun.protocol import messages as m
from uniun.runtime.chaos.wire import ChaosWire

__all__ = ["Workload", "WorkloadSettings", "BACKGROUND_KINDS"]

BACKGROUND_KINDS = ("extract", "nataraj", "gana")
_PROMPTS = (
    "The river remembers every stone it has passed.",
    "Write down three facts about the moon and one about the sea.",
    "Notes on the garden: tomatoes, basil, and the old pear tree.",
    "A short story about a lighthouse keeper who collects clocks.",
)
_CHATS = ("Hello! How are you?", "What is a good name for a cat?",
          "Tell me something about trains.")


@dataclass(frozen=True)
class WorkloadSettings:
    background: int = 3  # background jobs kept in flight
    bg_tokens: int = 300  # max_new_tokens of a background job
    chat_tokens: int = 24  # max_new_tokens of a chat
    chat_every_s: float = 2.0  # seconds between chats (one open at a time)
    model_id: str | None = None  # None: the runtime's chat model


class Workload:
    """See the module docstring."""

    def __init__(self, wire: ChaosWire, rng: random.Random, settings: WorkloadSettings,
                 run_id: str) -> None:
        self.wire, self.rng, self.s, self.run_id = wire, rng, settings, run_id
        self._n = 0
        self._next_chat = 0.0
        self._open_chat: str | None = None

    # -- jobs -------------------------------------------------------------------------

    def templates(self) -> list[str]:
        return [f"bg{i}" for i in range(len(_PROMPTS))] + \
            [f"chat{i}" for i in range(len(_CHATS))]

    def job(self, template: str, kind: str | None = None) -> dict[str, Any]:
        """A new job (fresh id) of ``template``."""
        self._n += 1
        job_id = f"chaos-{self.run_id}-{self._n}"
        index = int(template.lstrip("bgchat"))
        if template.startswith("chat"):
            job: dict[str, Any] = {
                "job_id": job_id, "kind": "chat", "max_new_tokens": self.s.chat_tokens,
                "messages": [{"role": "user", "content": _CHATS[index]}]}
        else:
            job = {"job_id": job_id, "kind": kind or BACKGROUND_KINDS[self._n % 3],
                   "prompt": _PROMPTS[index], "max_new_tokens": self.s.bg_tokens}
        if self.s.model_id:
            job["model_id"] = self.s.model_id
        job["sampling"] = {"temperature": 0}
        return job

    def calibration(self) -> list[tuple[dict[str, Any], str]]:
        """One job per template, for the fault-free reference texts."""
        return [(self.job(t), t) for t in self.templates()]

    # -- the loop ---------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Top up the background jobs; start the next chat when it is due."""
        open_jobs = self.wire.ledger.open_jobs()
        background = [h for h in open_jobs if h.kind != "chat"]
        for _ in range(self.s.background - len(background)):
            template = f"bg{self.rng.randrange(len(_PROMPTS))}"
            self.wire.submit(self.job(template), template)
        chat = self.wire.ledger.jobs.get(self._open_chat or "")
        if chat is not None and not chat.ended and chat.rejected is None:
            return
        if now >= self._next_chat:
            template = f"chat{self.rng.randrange(len(_CHATS))}"
            job = self.job(template)
            self._open_chat = job["job_id"]
            self.wire.submit(job, template)
            self._next_chat = now + self.s.chat_every_s

    def disconnecting_client(self, timeout_s: float = 30.0) -> str:
        """Submit from a second connection, leave after the first token; returns the job
        id (the main wire attaches to it) or raises ``TimeoutError``."""
        template = self.rng.choice([f"chat{self.rng.randrange(len(_CHATS))}",
                                    f"bg{self.rng.randrange(len(_PROMPTS))}"])
        job = self.job(template)
        ledger = self.wire.ledger
        ledger.submitted(job, template, self.wire.clock())
        sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.wire.endpoint)
        deadline = time.monotonic() + timeout_s
        try:
            sock.send(msgpack.packb(m.req_submit("leaver-1", job)))
            while time.monotonic() < deadline:
                if not sock.poll(200):
                    continue
                msg = msgpack.unpackb(sock.recv(), raw=False)
                if msg.get("re") == "leaver-1":
                    if msg.get("type") != "accepted":
                        ledger.rejected(job["job_id"], msg)
                        return job["job_id"]
                    ledger.accepted(job["job_id"], self.wire.clock())
                elif msg.get("type") in ("token", "done", "error"):
                    break  # mid-stream (or it was that quick): leave now
            else:
                raise TimeoutError("the leaving client saw no token")
        finally:
            sock.close(0)
        self.wire.attach(job["job_id"], -1)  # from seq 0: every token again
        return job["job_id"]
