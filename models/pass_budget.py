"""How many positions the next prompt pass may feed: a bound in time, not in tokens.

Why: the runner checks its inbox between forward passes, and aborts the pass in flight
when a command preempts the job (:meth:`~uniun.models.decoder_model.DecoderModel.interrupt`);
an aborted pass is computed again later, so its work is lost. A fixed count of positions
per pass costs 64 ms at 135M and seconds at 3B on the same machine. Sizing each pass from
the model's own measured costs keeps both the work an abort throws away and the wait of
any command that does not abort (a status, a drop) near ``target_s``, whatever the model.

The cost of a pass of ``n`` positions is modelled as ``overhead + n x per_position``:
``overhead`` is what every pass pays whatever its length (streaming the weights through
the caches: about one decode step), ``per_position`` the marginal cost of one more
position. Where the overhead alone approaches the target (a 3B model's decode step is
hundreds of ms here), passes sized to the target would be mostly overhead and the prefill
would crawl at decode speed; so a pass is never shorter than what keeps
``MIN_EFFICIENCY`` of its time on positions rather than overhead. The abort, not the
chunking, bounds a chat's wait for such a model.

:class:`PassCost` learns both terms as moving averages from the passes the runner times
(decode steps give the overhead, prompt passes the per-position cost; the warm-up
generation gives the first of each) and follows the context's growth and the machine's
load. Pure arithmetic with injected measurements: a test feeds it any costs it likes.
The result never goes below two positions (feed_plan's exactness rule).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MIN_EFFICIENCY", "MIN_PASS_POSITIONS", "PassCost", "pass_positions"]

MIN_PASS_POSITIONS = 2  # feed_plan: a prompt pass feeds at least two positions
# The least share of a pass spent on its positions rather than on its fixed overhead:
# 0.8 caps the bound's cost to prefill throughput near 20 % of the longest passes'.
MIN_EFFICIENCY = 0.8


def pass_positions(per_position_s: float | None, *, overhead_s: float = 0.0,
                   target_s: float, floor: int, ceiling: int,
                   min_efficiency: float = MIN_EFFICIENCY) -> int:
    """Positions of the next prompt pass: about ``target_s`` of compute, and never so few
    that the pass's ``overhead_s`` takes more than ``1 - min_efficiency`` of it.

    ``per_position_s``: the marginal cost of one position in a prompt pass (None before
    anything was measured: then ``floor`` positions, a small probe). ``floor`` and
    ``ceiling`` bound the pass whatever the costs say: the floor keeps a pass from
    collapsing to decode speed where the overhead is misjudged (it grows with the
    context during a prefill, and only decode steps measure it), the ceiling caps a
    fast model's. Never below :data:`MIN_PASS_POSITIONS`. ``target_s <= 0`` turns the
    time bound off: every pass is ``ceiling`` positions.
    """
    ceiling = max(MIN_PASS_POSITIONS, int(ceiling))
    floor = min(ceiling, max(MIN_PASS_POSITIONS, int(floor)))
    if target_s <= 0:
        return ceiling
    if per_position_s is None or per_position_s <= 0:
        return floor
    overhead = max(0.0, overhead_s)
    for_target = (target_s - overhead) / per_position_s
    efficiency = min(max(min_efficiency, 0.0), 0.95)
    for_efficiency = efficiency / (1.0 - efficiency) * overhead / per_position_s
    return max(floor, min(ceiling, int(max(for_target, for_efficiency))))


@dataclass
class PassCost:
    """Moving averages of a pass's fixed overhead and of its cost per position.

    ``weight``: the share of each new pass in its average (0.3: the last few passes
    dominate, so costs learnt while the machine was busy, or at a short context, are
    forgotten within a handful of passes).
    """

    weight: float = 0.3
    per_position_s: float | None = None
    overhead_s: float = 0.0
    passes: int = 0

    def observe_step(self, seconds: float) -> None:
        """Fold in a one-position pass (a decode step): nearly all overhead."""
        if seconds > 0:
            self.overhead_s = seconds if self.overhead_s == 0 else (
                self.overhead_s + self.weight * (seconds - self.overhead_s))

    def observe(self, positions: int, seconds: float) -> None:
        """Fold in a prompt pass of ``positions`` (fewer than two: not a prompt pass)."""
        if positions < MIN_PASS_POSITIONS or seconds <= 0:
            return
        # What the positions cost beyond the overhead; at least a tenth of the pass, so a
        # stale overhead (a busier moment) cannot make positions look free.
        sample = max(seconds - self.overhead_s, 0.1 * seconds) / positions
        old = self.per_position_s
        self.per_position_s = sample if old is None else old + self.weight * (sample - old)
        self.passes += 1

    def reset(self) -> None:
        """Forget the costs (another model was loaded)."""
        self.per_position_s, self.overhead_s, self.passes = None, 0.0, 0
