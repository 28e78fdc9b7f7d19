"""How many positions the next prompt pass may feed: a bound in time, not in tokens.

Why: the runner checks its inbox between forward passes, so a chat that arrives during a
background job's prefill pass waits for that pass (unless the pass is aborted, see
:meth:`~uniun.models.decoder_model.DecoderModel.interrupt`; an aborted pass is computed
again later, so a long one wastes background work). A fixed count of positions per pass
costs 64 ms at 135M and seconds at 3B on the same machine. Sizing each pass from the
model's own measured prefill rate keeps every pass near ``target_s`` of compute whatever
the model, so both the wait and the work an abort throws away stay bounded in time.

The rate is learned, not configured: :class:`PrefillRate` keeps a moving average of
seconds per position over the passes the runner times (the warm-up generation's first
pass included), and follows the context's growth (later positions attend to more).
Pure arithmetic with injected measurements: a test feeds it any rate it likes.

The result never goes below two positions (feed_plan's exactness rule: prompt passes of
at least two positions), whatever the rate says.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MIN_PASS_POSITIONS", "PrefillRate", "pass_positions"]

MIN_PASS_POSITIONS = 2  # feed_plan: a prompt pass feeds at least two positions


def pass_positions(seconds_per_position: float | None, *, target_s: float, first: int,
                   ceiling: int) -> int:
    """Positions of the next prompt pass: about ``target_s`` of compute at the given rate.

    ``seconds_per_position``: the measured cost of one position in a prompt pass (None
    before anything was measured: then ``first`` positions, a small probe). ``ceiling``
    caps the pass however fast the model is (large passes buy little throughput and hold
    the runner's memory for activations). Never below :data:`MIN_PASS_POSITIONS`.
    ``target_s <= 0`` turns the time bound off: every pass is ``ceiling`` positions.
    """
    ceiling = max(MIN_PASS_POSITIONS, int(ceiling))
    if target_s <= 0:
        return ceiling
    if seconds_per_position is None or seconds_per_position <= 0:
        n = int(first)
    else:
        n = int(target_s / seconds_per_position)
    return max(MIN_PASS_POSITIONS, min(ceiling, n))


@dataclass
class PrefillRate:
    """A moving average of seconds per prompt position, from passes as they are timed.

    ``weight``: the share of each new pass in the average (0.3: the last few passes
    dominate, so a rate learnt while the machine was busy, or at a short context, is
    forgotten within a handful of passes).
    """

    weight: float = 0.3
    seconds_per_position: float | None = None
    passes: int = 0

    def observe(self, positions: int, seconds: float) -> None:
        """Fold one timed pass in (passes of fewer than two positions are not prefill)."""
        if positions < MIN_PASS_POSITIONS or seconds <= 0:
            return
        sample = seconds / positions
        old = self.seconds_per_position
        self.seconds_per_position = sample if old is None else (
            old + self.weight * (sample - old))
        self.passes += 1

    def reset(self) -> None:
        """Forget the rate (another model was loaded)."""
        self.seconds_per_position = None
        self.passes = 0
