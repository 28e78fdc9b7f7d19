"""The T2 budget (docs/scheduling.md, "T2 budget"): extract's share of runner time, rolling window.

Why a ratio over busy time, not over the window's length: with a length-based cap
(180 of every 300 s) T2 would take its whole 180 s first while fair-pool work waits
minutes; the ratio lets the fair pool in as soon as T2 has had its share of what ran.
Its weakness, wild swings while the window is nearly empty (after start or an idle
spell), is damped by the policy: a fair-pool job runs at least one slice before T2 may
take the runner back.

The ledger holds samples of (time, seconds, whether the job was dispatched as T2), one
per ``t2_window_s / 100`` slot at most (reports inside one slot are merged, so a busy
host cannot grow the ledger, and the window rolls in at most 100 steps). The share is
T2 seconds over all seconds in the last ``t2_window_s``,
counting the running job's not-yet-reported seconds too, so that a long job is judged
while it runs, not after.

The budget is *blocked* once the share reaches ``t2_share_max`` and unblocked once it has
fallen to ``t2_share_max - t2_hysteresis``; without the gap T2 and the fair pool would
trade the runner every few tokens at the boundary. Blocking only means "T2 is skipped
while other work can run": the picker is work-conserving.
"""

from __future__ import annotations

import math
from collections import deque

from uniun.actors.policy.config import PolicyConfig

_SLOT_EPS = 1e-6  # of a slot: absorbs float error at slot boundaries (3 µs at 5-min windows)


class T2Budget:
    """Rolling-window ledger of runner time, and the blocked/unblocked state."""

    def __init__(self, config: PolicyConfig) -> None:
        self._window = config.t2_window_s
        self._max = config.t2_share_max
        self._resume = config.t2_share_max - config.t2_hysteresis
        self._slot = config.t2_window_s / 100.0
        # (slot index, seconds, is_t2); at most two samples (T2 and other) per slot.
        # Integer slot indexes, not float slot starts: ``floor(t / slot) * slot`` lands a
        # hair above or below the true boundary, which kept a sample one slot too long.
        self._samples: deque[tuple[int, float, bool]] = deque()
        self._t2 = 0.0
        self._total = 0.0
        self.blocked = False

    def _slot_of(self, t: float) -> int:
        """The index of the slot holding time ``t`` (a boundary belongs to the later one)."""
        return math.floor(t / self._slot + _SLOT_EPS)

    def charge(self, now: float, runner_s: float, is_t2: bool) -> None:
        """Record ``runner_s`` seconds that ended at ``now``, in the slots they covered.

        A report covers the time since the previous one; booking all of it at ``now``
        would keep time that was used before the window's start inside the window (and
        let T2 overshoot its share by that much), so it is spread over its slots.
        """
        if runner_s <= 0:
            return
        start = now - runner_s
        first, last = self._slot_of(start), self._slot_of(now)
        for slot in range(first, last + 1):
            lo = max(start, slot * self._slot)
            hi = min(now, (slot + 1) * self._slot)
            seconds = runner_s if first == last else max(0.0, hi - lo)
            if seconds > 0:
                self._add(slot, seconds, is_t2)

    def _add(self, slot: int, seconds: float, is_t2: bool) -> None:
        self._total += seconds
        if is_t2:
            self._t2 += seconds
        samples = self._samples
        for i in (-1, -2):
            if len(samples) >= -i and samples[i][0] == slot and samples[i][2] == is_t2:
                samples[i] = (slot, samples[i][1] + seconds, is_t2)
                return
        samples.append((slot, seconds, is_t2))

    def _trim(self, now: float) -> None:
        cutoff = self._slot_of(now - self._window)
        samples = self._samples
        while samples and samples[0][0] <= cutoff:
            _, seconds, is_t2 = samples.popleft()
            self._total -= seconds
            if is_t2:
                self._t2 -= seconds
        if not samples:  # no drift from repeated float subtraction
            self._t2 = self._total = 0.0

    def share(self, now: float, running_s: float = 0.0, running_t2: bool = False) -> float:
        """T2's share of runner time in the window ending now (0 when nothing ran)."""
        self._trim(now)
        total = self._total + running_s
        t2 = self._t2 + (running_s if running_t2 else 0.0)
        return t2 / total if total > 0 else 0.0

    def update(self, now: float, running_s: float = 0.0, running_t2: bool = False) -> bool:
        """Re-evaluate ``blocked`` at ``now`` and return it."""
        share = self.share(now, running_s, running_t2)
        if share >= self._max:
            self.blocked = True
        elif share <= self._resume:
            self.blocked = False
        return self.blocked

    def next_change(self, now: float, running_s: float, running_t2: bool,
                    running: bool) -> float | None:
        """When ``blocked`` may next flip if nothing else happens (for the wake timer).

        Exact while the running job keeps running and no sample leaves the window; at the
        next sample expiry it is simply asked again.
        """
        self._trim(now)
        total = self._total + running_s
        t2 = self._t2 + (running_s if running_t2 else 0.0)
        times: list[float] = []
        if self._samples:
            times.append(self._samples[0][0] * self._slot + self._window)
        if running:
            if running_t2 and not self.blocked and self._max < 1.0:
                # (t2 + x) / (total + x) = max  ->  x = (max * total - t2) / (1 - max)
                x = (self._max * total - t2) / (1.0 - self._max)
                times.append(now + max(x, 0.0))
            elif not running_t2 and self.blocked and self._resume > 0:
                # t2 / (total + x) = resume  ->  x = t2 / resume - total
                x = t2 / self._resume - total
                times.append(now + max(x, 0.0))
        later = [t for t in times if t > now]
        return min(later) if later else None
