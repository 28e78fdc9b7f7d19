"""The fair pool's bookkeeping (docs/scheduling.md, "Fair pool"), in the manner of Linux CFS.

Nouns: a *flow* is the fairness key of a job (job field ``flow``, default its kind);
``vruntime[flow]`` is the runner time its jobs consumed divided by the flow's weight;
``min_vruntime`` is where a new (or long-absent) flow is placed so it cannot monopolise
the pool with a zero counter.

Invariants:
- All charging happens in :meth:`FairPool.account` ("you ran, you pay": also for runs
  that ended in a pause, a cancel or a failure).
- All seeding happens in :meth:`FairPool.place`.
- ``min_vruntime`` never moves backwards, except that :meth:`FairPool.tick` halves it
  together with every vruntime (the same factor, so no order changes).
- Halving every ``halving_period_s`` bounds every vruntime: one runner can hand out at
  most one period of seconds per period, so no counter exceeds about
  ``halving_period_s / min weight`` plus one report's charge.
"""

from __future__ import annotations

from uniun.actors.policy.config import PolicyConfig


class FairPool:
    """vruntime per flow, min_vruntime, halving, and which flows are present."""

    def __init__(self, config: PolicyConfig, now: float) -> None:
        self._config = config
        self.vruntime: dict[str, float] = {}
        self.min_vruntime = 0.0
        self._present: dict[str, int] = {}   # flow -> live jobs (waiting or running)
        self._left_at: dict[str, float] = {}  # flow -> when its last job ended
        self.next_halving = now + config.halving_period_s

    def place(self, flow: str, now: float) -> None:
        """A job of ``flow`` arrives: seed the flow if it is new or was away too long."""
        count = self._present.get(flow, 0)
        if count == 0:
            left = self._left_at.get(flow)
            if flow not in self.vruntime or (
                    left is not None and now - left > self._config.flow_return_s):
                self.vruntime[flow] = self.min_vruntime
        self._present[flow] = count + 1

    def leave(self, flow: str, now: float) -> None:
        """A job of ``flow`` ended (done, cancelled or failed)."""
        count = self._present.get(flow, 0) - 1
        if count <= 0:
            self._present.pop(flow, None)
            self._left_at[flow] = now
        else:
            self._present[flow] = count
        self._update_min()

    def account(self, flow: str, runner_s: float) -> None:
        """Charge ``runner_s`` seconds of runner time to ``flow`` (update_curr)."""
        if runner_s <= 0:
            return
        self.vruntime[flow] = self.vruntime.get(flow, self.min_vruntime) + (
            runner_s / self._config.weight(flow))
        self._update_min()

    def key(self, flow: str) -> float:
        """The flow's vruntime (smaller runs first)."""
        return self.vruntime.get(flow, self.min_vruntime)

    def tick(self, now: float) -> None:
        """Halve every vruntime once per elapsed halving period."""
        if now < self.next_halving:
            return
        period = self._config.halving_period_s
        periods = int((now - self.next_halving) // period) + 1
        factor = 0.5 ** periods
        for flow in self.vruntime:
            self.vruntime[flow] *= factor
        self.min_vruntime *= factor
        self.next_halving += periods * period

    def _update_min(self) -> None:
        if self._present:
            lowest = min(self.vruntime.get(f, self.min_vruntime) for f in self._present)
            if lowest > self.min_vruntime:
                self.min_vruntime = lowest
