"""The scheduler's power inputs (docs/device.md, "Power and heat"): facts read from sysfs
by the power watch, facts an app pushed in a ``lifecycle`` message, and what the policy's
governor decided, as timeline marks and the ``power`` object of ``status``.

Two sources, merged field by field (``protocol/power_state.py:merge``): what an app
pushed wins over what this machine's sysfs says for the fields the app named, so a
phone's app is believed about its own battery while a laptop's sysfs fills the rest.
Pure, like the rest of the core: the facts arrive as values.
"""

from __future__ import annotations

from typing import Any

from uniun.actors.policy import PolicyBase
from uniun.actors.scheduler.effects import Effects
from uniun.actors.scheduler.recorder import Recorder
from uniun.protocol.power_state import PowerState, merge

__all__ = ["PowerInputs"]


class PowerInputs:
    """Mixed into the core: keeps both sources and turns changes into marks."""

    policy: PolicyBase
    rec: Recorder
    changes: int
    power_read: PowerState = PowerState()  # from sysfs (the power watch), if any
    power_pushed: PowerState = PowerState()  # from an app's lifecycle message, if any
    power_source = "none"  # "sysfs", "app", "app+sysfs" or "none"

    def power_from_sysfs(self, state: PowerState) -> Effects:
        """The power watch read new facts."""
        self.power_read = state
        return self._power_changed("sysfs")

    def power_from_app(self, state: PowerState) -> Effects:
        """An app pushed facts (the ``power`` map of ``lifecycle``)."""
        self.power_pushed = state
        return self._power_changed("app")

    def _power_changed(self, source: str) -> Effects:
        fx = Effects()
        effective = merge(self.power_pushed, self.power_read)
        sources = [name for name, state in (("app", self.power_pushed),
                                             ("sysfs", self.power_read))
                   if state != PowerState()]
        self.power_source = "+".join(sources) or "none"
        if effective != self.policy.power.state:
            self.changes += 1
            self.rec.mark(fx, "power", None, f"{effective.describe()} (from {source})")
            self.policy.set_power(effective)
            self.power_marks(fx)
        return fx

    def power_marks(self, fx: Effects) -> None:
        """The governor's decisions since the last input, as ``power`` marks."""
        for job_id, why in self.policy.take_power_notes():
            self.rec.mark(fx, "power", job_id, why)

    def power_status(self) -> dict[str, Any]:
        """``status.power``: the facts, where they came from, and the governor's mode."""
        state = self.policy.power.state
        return {**state.as_dict(), "source": self.power_source,
                **self.policy.power_status()}
