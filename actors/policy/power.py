"""The power governor (docs/device.md, "Power and heat"): how much background work the
device's charger, battery and temperature allow. Pure: the facts and the time come in as
arguments; no file, no clock of its own.

Modes, from the facts (the first that applies):

    paused         thermal hot or critical: no background job runs
    deadline_only  on battery below low_battery_percent: only jobs with a deadline run
    duty           thermal warm: background work holds the runner at most warm_duty of
                   the time (on battery too: the smaller of the two shares)
    budget         on battery: battery_runner_s_per_h runner-seconds per hour
    normal         on the charger, or nothing known: background work runs as ever

"Background" is every job but chat and the foreground kind's (T1): what the user waits
for is never throttled by power. Unknown facts (no battery, no thermal zone) never
throttle: a desktop on mains reads as the charger.

A share is kept with a token bucket measured in runner-seconds: it fills at ``share``
seconds per second up to ``power_burst_s``, and a background job's runner time drains
it. A throttled job is dispatched once the bucket holds ``power_resume_s`` and paused when
it is empty, so background work alternates runs of about
``power_resume_s / (1 - share)`` seconds with waits of ``power_resume_s / share``: at 50 %,
4 s on and 4 s off with the defaults. The policy asks :meth:`may_start` and
:meth:`may_continue`, and reports runner time with :meth:`charge`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from uniun.actors.policy.config import PolicyConfig
from uniun.actors.policy.job import PolicyJob
from uniun.protocol.power_state import PowerState

__all__ = ["PowerMode", "PowerGovernor", "mode_of"]

PowerMode = Literal["normal", "budget", "duty", "deadline_only", "paused"]


def mode_of(state: PowerState, config: PolicyConfig) -> tuple[PowerMode, float | None, str]:
    """(mode, share of time background work may use or None for no limit, reason)."""
    if state.thermal in ("hot", "critical"):
        return "paused", 0.0, f"thermal {state.thermal}"
    battery = state.on_battery is True
    if (battery and state.percent is not None
            and state.percent < config.low_battery_percent):
        return ("deadline_only", 0.0,
                f"battery {state.percent:.0f} % < {config.low_battery_percent:g} %")
    battery_share = config.battery_runner_s_per_h / 3600.0
    if state.thermal == "warm":
        share = min(config.warm_duty, battery_share) if battery else config.warm_duty
        return "duty", share, "thermal warm" + (", on battery" if battery else "")
    if battery:
        level = "" if state.percent is None else f" {state.percent:.0f} %"
        return ("budget", battery_share,
                f"on battery{level}: {config.battery_runner_s_per_h:g} runner-s/h")
    return "normal", None, "on the charger" if state.on_battery is False else "power unknown"


def governed(job: PolicyJob, config: PolicyConfig, foreground: str | None) -> bool:
    """Is ``job`` background work the governor may throttle? Not chat, and not the
    foreground kind's T1 work (for extraction: only jobs submitted with the hint)."""
    if job.kind == config.chat_kind:
        return False
    return not (job.kind == foreground and (foreground != config.extract_kind
                                            or bool(job.spec.foreground_hint)))


class PowerGovernor:
    """The mode and the token bucket; see the module docstring."""

    def __init__(self, config: PolicyConfig, now: float) -> None:
        self.config = config
        self.state = PowerState()
        self.mode: PowerMode = "normal"
        self.share: float | None = None
        self.reason = "power unknown"
        self._level = config.power_burst_s  # runner-seconds saved up
        self._at = now  # when _level was last brought up to date

    # --- inputs -----------------------------------------------------------------------------
    def set_state(self, state: PowerState, now: float) -> bool:
        """New facts; return whether the mode (or its share) changed."""
        self._refill(now)
        self.state = state
        mode, share, reason = mode_of(state, self.config)
        changed = (mode, share) != (self.mode, self.share)
        self.mode, self.share, self.reason = mode, share, reason
        return changed

    def charge(self, runner_s: float, now: float) -> None:
        """Background work used ``runner_s`` runner-seconds, ending at ``now``."""
        self._refill(now)
        if self.share is not None:
            self._level = max(-self.config.power_burst_s, self._level - runner_s)

    # --- questions --------------------------------------------------------------------------
    def level(self, now: float, running_s: float = 0.0) -> float:
        """Runner-seconds saved up at ``now``, less what the running job has not reported."""
        self._refill(now)
        return self._level - running_s

    def may_start(self, now: float, *, has_deadline: bool) -> bool:
        """May a waiting background job be dispatched now?"""
        if self.mode == "normal":
            return True
        if self.mode == "deadline_only":
            return has_deadline
        if self.mode == "paused":
            return False
        return self.level(now) >= self.config.power_resume_s - 1e-9

    def may_continue(self, now: float, running_s: float, *, has_deadline: bool) -> bool:
        """May the running background job go on (``running_s``: not yet reported)?"""
        if self.mode in ("normal", "deadline_only", "paused"):
            return self.may_start(now, has_deadline=has_deadline)
        return self.level(now, running_s) > 0

    def next_change(self, now: float, running_s: float, running: bool) -> float | None:
        """When a throttled answer may flip if nothing else happens (for the wake timer):
        the bucket reaching ``power_resume_s`` while nothing runs, or emptying while a
        background job runs. None where time alone changes nothing."""
        share = self.share
        if self.mode not in ("budget", "duty") or share is None:
            return None
        level = self.level(now, running_s)
        if running:
            if share >= 1.0:
                return None
            return now + max(level, 0.0) / (1.0 - share)
        if share <= 0:
            return None
        missing = self.config.power_resume_s - level
        return now + missing / share if missing > 0 else None

    def status(self, now: float) -> dict[str, Any]:
        return {"mode": self.mode, "reason": self.reason,
                "background_share": self.share,
                "saved_s": None if self.share is None else round(self.level(now), 3)}

    # --- the bucket -------------------------------------------------------------------------
    def _refill(self, now: float) -> None:
        elapsed = now - self._at
        if elapsed > 0:
            if self.share is None:
                self._level = self.config.power_burst_s
            elif math.isfinite(elapsed):
                self._level = min(self.config.power_burst_s,
                                  self._level + self.share * elapsed)
        self._at = max(self._at, now)
