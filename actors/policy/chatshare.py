"""Fair shares between the clients that chat (T0), by virtual token counters (VTC).

Why: T0 is every client's chat, and first come, first served across clients lets one
client's long chat (or its ``n`` choices, each a job) hold every other client's first
token for as long as it generates. So the chats of T0 are ordered by *client*, in the
manner of the Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language
Models", OSDI'24):

- ``counter[client]`` grows with the service the client's chats got: one per generated
  token, ``chat_prompt_weight`` per prompt token (a prompt token is computed in a batch,
  a generated token in a step of its own, so it costs the runner less). Every job of a
  client counts against the one counter: its ``n`` choices, its many connections (when
  the host can tell they are one client: the host names the client).
- The chat to run next is the one of the client with the smallest counter; on equal
  counters, of the client served least recently (a client arriving, or just lifted,
  before the one that is running: so a running client that is paused for a rival with
  the same counter cannot be picked again in its place). One client's own chats keep
  their first-come order.
- A client that arrives (its first live chat) is *lifted* to ``floor``, the smallest
  counter of the clients with live chats, which never moves backwards: a client cannot
  bank credit while it is idle and then hold the runner for as long as it banked.
- Counters are compared, never reset while a client is active; a client that leaves with
  a counter at or below ``floor`` is forgotten (it would be lifted to ``floor`` anyway),
  so what is kept is bounded by the clients active now and those ahead of ``floor``.

The quantum against thrashing (``chat_quantum_tokens``) is the policy's, not this
object's: :class:`~uniun.actors.policy.uniun.UniunPolicy` lets a client that took the
runner by pausing another client's chat keep it for that many tokens.

This object only orders clients; it does not know about runners or steps, so a batching
runner can hand out its batch slots with it as well (the k clients with the smallest
counters, charged per token as each step serves them).
"""

from __future__ import annotations

from collections.abc import Iterable

from uniun.actors.policy.config import PolicyConfig
from uniun.actors.policy.job import PolicyJob


class ChatShare:
    """Virtual token counters per client, the floor, and which clients are active."""

    def __init__(self, config: PolicyConfig) -> None:
        self._prompt_weight = config.chat_prompt_weight
        self.counter: dict[str, float] = {}
        self.floor = 0.0
        self._served: dict[str, int] = {}  # client -> sequence number of its last service
        self._seq = 0
        self._active: dict[str, int] = {}  # client -> live chats (waiting or running)

    def arrive(self, client: str) -> None:
        """A chat of ``client`` became live: lift the client to ``floor`` if it was idle."""
        count = self._active.get(client, 0)
        if count == 0:
            self.counter[client] = max(self.counter.get(client, self.floor), self.floor)
        self._active[client] = count + 1

    def leave(self, client: str) -> None:
        """A chat of ``client`` ended (done, cancelled or failed)."""
        count = self._active.get(client, 0) - 1
        if count > 0:
            self._active[client] = count
            return
        self._active.pop(client, None)
        self._raise_floor()
        if self.counter.get(client, self.floor) <= self.floor:
            self.counter.pop(client, None)
            self._served.pop(client, None)
        if len(self.counter) > 2 * len(self._active) + 64:  # keep it O(active clients)
            self.counter = {c: v for c, v in self.counter.items()
                            if c in self._active or v > self.floor}
            self._served = {c: n for c, n in self._served.items() if c in self.counter}

    def charge(self, client: str, *, prompt_tokens: int = 0, tokens: int = 0) -> None:
        """``client`` was served ``prompt_tokens`` of prompt and ``tokens`` generated."""
        cost = tokens + self._prompt_weight * prompt_tokens
        if cost <= 0:
            return
        self.counter[client] = self.counter.get(client, self.floor) + cost
        self._seq += 1
        self._served[client] = self._seq
        self._raise_floor()

    def key(self, client: str) -> float:
        """The client's counter."""
        return self.counter.get(client, self.floor)

    def order(self, client: str) -> tuple[float, int]:
        """Where the client's chats go (smaller first): its counter, then how recently
        it was served (never: first)."""
        return self.counter.get(client, self.floor), self._served.get(client, 0)

    def rival(self, client: str, fronts: Iterable[tuple[str, PolicyJob]]) -> PolicyJob | None:
        """Of the other clients' front chats ``(client, job)``, the one that goes before
        ``client`` in this order (the first of them, ties to the earlier job), or None."""
        limit, best = self.order(client), None
        for other, front in fronts:
            if other == client:
                continue
            order = (*self.order(other), front.key)
            if order[:2] < limit and (best is None or order < best[0]):
                best = (order, front)
        return None if best is None else best[1]

    def active(self) -> int:
        """How many clients have live chats."""
        return len(self._active)

    def _raise_floor(self) -> None:
        if self._active:
            lowest = min(self.counter.get(c, self.floor) for c in self._active)
            if lowest > self.floor:
                self.floor = lowest
