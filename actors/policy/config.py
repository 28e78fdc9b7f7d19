"""Every tunable of the scheduling policy (docs/scheduling.md), with its default and unit.

One frozen object, so that a run of the policy is fully described by (config, inputs,
clock). ``runtime/config.py`` builds it from the ``[policy]`` table of the TOML file: it
accepts any field below by name, checked against the type of the default, so a field
must stay a plain bool / int / float / str / tuple / mapping.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


def _no_weights() -> Mapping[str, float]:
    return MappingProxyType({})


@dataclass(frozen=True)
class PolicyConfig:
    """The defaults of docs/scheduling.md. Times are seconds of the policy clock."""

    # --- kinds (rules: T0 admits chat, T2 admits extract) -------------------------------
    # Kind that is T0 (preempted only by another client's chat; no budget). Default "chat".
    chat_kind: str = "chat"
    # Kind that is T2 (budgeted); in T1 only with foreground_hint. Default "extract".
    extract_kind: str = "extract"

    # --- T0: fair shares between the clients that chat (chatshare.py) -----------------
    # Tokens a client's chats may generate, after the client took the runner by pausing
    # another client's chat, before a chat of a client with less service may take it
    # back. Default 16: each switch costs a pause and a resume (about a decode step each),
    # so smaller means finer alternation and more of them. A client that found the runner
    # free of other clients' chats has no such turn: a new client takes the runner from
    # it at the next token.
    chat_quantum_tokens: int = 16
    # What one prompt token adds to its client's counter, in generated tokens. Default 0.5
    # (a prompt token is computed in a batch with the others, a generated one in a step of
    # its own).
    chat_prompt_weight: float = 0.5

    # --- rule 4: fair pool (CFS) ---------------------------------------------------------
    # Seconds of runner time a running T4 job may use before it is re-examined. Default 2.0.
    slice_s: float = 2.0
    # Seconds of vruntime by which another flow must be behind the running one before the
    # running T4 job is paused for it at a slice boundary. Default 4.0 (two slices): larger
    # means fewer pauses (each costs a snapshot), smaller means finer alternation.
    granularity_s: float = 4.0
    # Seconds between halvings of every vruntime (keeps counters bounded, forgets old
    # history). Default 300.0 (5 min).
    halving_period_s: float = 300.0
    # Seconds a flow must have had no job before it is re-seeded at min_vruntime when it
    # returns. Default 300.0 (5 min).
    flow_return_s: float = 300.0
    # Flow name -> weight (> 0). A flow is charged runner seconds / weight. Default: none
    # listed, every flow weighs default_weight.
    flow_weights: Mapping[str, float] = field(default_factory=_no_weights)
    # Weight of a flow not listed in flow_weights. Default 1.0.
    default_weight: float = 1.0

    # --- rule 5: T2 budget ---------------------------------------------------------------
    # Largest share (0..1) of runner time that T2 may take over the window while other
    # work waits. Default 0.60.
    t2_share_max: float = 0.60
    # Seconds of the rolling window over which the T2 share is measured. Default 300.0.
    t2_window_s: float = 300.0
    # Share below t2_share_max the T2 share must fall back to before T2 is picked again
    # (stops T2 and the fair pool from swapping every few tokens). Default 0.05.
    t2_hysteresis: float = 0.05

    # --- rule 7: model affinity ------------------------------------------------------------
    # Seconds after the last chat within which a T4 job may not swap away from the chat
    # model. Default 20.0.
    chat_idle_gap_s: float = 20.0
    # Seconds a job may wait for affinity (skipped because it is on another model) before
    # it is picked as if its model were loaded. Default 120.0.
    starvation_s: float = 120.0

    # --- rule 8: lifecycle governor --------------------------------------------------------
    # Share (0..1] of max_new_tokens granted to each non-chat dispatch while the app is in
    # the background. Default 0.25.
    background_grant: float = 0.25

    # --- rule 9: power governor (docs/device.md) --------------------------------------------
    # Runner-seconds per hour that background work (every job but chat and the foreground
    # kind) may use while the device runs on its battery. Default 600.0 (a share of 1/6).
    battery_runner_s_per_h: float = 600.0
    # Battery percent below which, on battery, only jobs with a deadline run. Default 20.0.
    low_battery_percent: float = 20.0
    # Share (0..1] of time background work may hold the runner while the device is warm
    # (a passive trip point reached). Default 0.5.
    warm_duty: float = 0.5
    # Runner-seconds background work may save up under a battery budget or a duty cycle.
    # Default 5.0.
    power_burst_s: float = 5.0
    # Runner-seconds saved up before a throttled background job runs again (fewer, longer
    # runs: each pause parks a snapshot). Default 2.0; at most power_burst_s.
    power_resume_s: float = 2.0

    def __post_init__(self) -> None:
        positive = ("slice_s", "halving_period_s", "t2_window_s", "default_weight",
                    "power_burst_s", "power_resume_s")
        non_negative = ("chat_prompt_weight", "granularity_s", "flow_return_s",
                        "chat_idle_gap_s", "starvation_s", "t2_hysteresis",
                        "battery_runner_s_per_h", "low_battery_percent")
        for name in positive:
            value = getattr(self, name)
            if not _finite(value) or value <= 0:
                raise ValueError(f"{name} must be a number > 0 (got {value!r})")
        for name in non_negative:
            value = getattr(self, name)
            if not _finite(value) or value < 0:
                raise ValueError(f"{name} must be a number >= 0 (got {value!r})")
        if self.battery_runner_s_per_h > 3600 or self.low_battery_percent > 100:
            raise ValueError("battery_runner_s_per_h must be <= 3600 and "
                             "low_battery_percent <= 100")
        if self.power_resume_s > self.power_burst_s:
            raise ValueError("power_resume_s must not exceed power_burst_s")
        quantum = self.chat_quantum_tokens
        if not isinstance(quantum, int) or isinstance(quantum, bool) or quantum < 1:
            # 0 would let two clients with equal counters trade the runner without a token
            raise ValueError(f"chat_quantum_tokens must be an integer >= 1 (got {quantum!r})")
        for name in ("t2_share_max", "background_grant", "warm_duty"):
            value = getattr(self, name)
            if not _finite(value) or not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1] (got {value!r})")
        if self.t2_hysteresis >= self.t2_share_max:
            raise ValueError("t2_hysteresis must be smaller than t2_share_max")
        if not self.chat_kind or not self.extract_kind or self.chat_kind == self.extract_kind:
            raise ValueError("chat_kind and extract_kind must be distinct, non-empty kinds")
        for flow, weight in self.flow_weights.items():
            if not isinstance(flow, str) or not _finite(weight) or weight <= 0:
                raise ValueError(f"flow_weights[{flow!r}] must be a number > 0 "
                                 f"(got {weight!r})")
        # Frozen, but a caller's dict must not change our weights behind our back.
        object.__setattr__(self, "flow_weights",
                           MappingProxyType(dict(self.flow_weights)))

    def weight(self, flow: str) -> float:
        """The CFS weight of ``flow``."""
        return float(self.flow_weights.get(flow, self.default_weight))


def _finite(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
