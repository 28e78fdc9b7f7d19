"""How long the runner's passes are, which commands cut one short, and the test paces.

Why apart from :mod:`uniun.actors.runner.jobs`: what a pass *does* (start, step, park) is
the jobs' business; how many positions a prompt pass feeds and how fast a segment may
go is one small policy with its own clock, tested on a fake one.

- **Pass sizes** (docs/scheduler-runner.md, "Bounded passes"): each prompt pass is about
  ``target_s`` of compute, from the loaded model's measured costs
  (:class:`~uniun.models.pass_budget.PassCost`), between ``chunk_min`` and ``chunk_max``
  positions. Every timed pass is told here: prompt passes give the cost per position,
  decode steps the overhead every pass pays.
- **Which commands abort a pass** (:func:`preempts`): those that take the model from
  the active job; the worker's pump thread aborts its pass as such a command arrives.
- **Test paces** (runtime/runner_main.py's ``UNIUN_TEST_TOKEN_PACE_S`` and
  ``UNIUN_TEST_PASS_PACE_S``; 0: off): a segment's n tokens take at least n x
  ``token_pace_s`` of runner time, a prompt pass of n positions at least n x
  ``pass_pace_s``, so a test's long job or long prefill outlasts a slice, a deadline or
  a chat however fast the machine. The waits go through ``sleep``, which the worker cuts
  short when a command preempts the job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from uniun.models.pass_budget import PassCost, pass_positions
from uniun.protocol import runner_records as rp

__all__ = ["PASS_FLOOR", "PASS_TARGET_S", "PREFILL_CHUNK", "Pacing", "preempts"]

PASS_TARGET_S = 0.05  # seconds of compute per prompt pass (config runner.pass_target_ms)
PASS_FLOOR = 16  # least positions per prompt pass (config runner.prefill_chunk_min)
PREFILL_CHUNK = 64  # most positions per prompt pass (config runner.prefill_chunk_max)


@dataclass
class Pacing:
    """See the module docstring. ``clock``/``sleep``: injected (a fake clock in tests)."""

    target_s: float = PASS_TARGET_S
    chunk_min: int = PASS_FLOOR
    chunk_max: int = PREFILL_CHUNK
    token_pace_s: float = 0.0
    pass_pace_s: float = 0.0
    clock: Callable[[], float] = time.perf_counter
    sleep: Callable[[float], None] = time.sleep
    cost: PassCost = field(default_factory=PassCost)  # the loaded model's
    _paced_from: tuple[float, int] = (0.0, 0)  # (segment start, tokens then)

    def positions(self, *, bounded: bool = True) -> int:
        """Positions the next prompt pass may feed (models/pass_budget.py). A chat's
        passes (``bounded=False``) are ``chunk_max`` long: nothing preempts a chat, and
        every extra pass would add its overhead to the chat's time to first token."""
        return pass_positions(self.cost.per_position_s, overhead_s=self.cost.overhead_s,
                              target_s=self.target_s if bounded else 0.0,
                              floor=self.chunk_min, ceiling=self.chunk_max)

    def warmed(self, prompt: int, prompt_s: float, step_s: float | None) -> None:
        """The warm-up generation's prompt pass and decode step: the model's first costs."""
        if step_s is not None:
            self.cost.observe_step(step_s)
        self.cost.observe(prompt, prompt_s)

    def after_pass(self, fed: int, seconds: float) -> None:
        """A prompt or replay pass of ``fed`` positions took ``seconds``."""
        self.cost.observe(fed, seconds)
        if self.pass_pace_s > 0:
            self.sleep(max(0.0, fed * self.pass_pace_s - seconds))

    def after_token(self, fed: int, seconds: float, generated: int) -> None:
        """A step that made token ``generated - 1`` fed ``fed`` positions in ``seconds``."""
        if fed == 1:  # a decode step: the overhead every pass pays
            self.cost.observe_step(seconds)
        if self.token_pace_s > 0:  # a slower machine never sleeps; one slow for a while
            since, tokens0 = self._paced_from  # catches up before it sleeps again
            due = since + (generated - tokens0) * self.token_pace_s
            self.sleep(max(0.0, due - self.clock()))

    def segment(self, start: float, generated: int) -> None:
        """A segment starts at ``start`` with ``generated`` tokens (the token pace's base)."""
        self._paced_from = (start, generated)

    def new_model(self) -> None:
        """Another model was loaded: its costs are unknown."""
        self.cost.reset()


def preempts(command: rp.Command, active_job: str) -> bool:
    """Whether handling ``command`` ends the active job's segment: a pause or cancel of
    it, a start or resume of another job, a model load (each parks the active job)."""
    if isinstance(command, (rp.Pause, rp.Cancel)):
        return command.job_id == active_job
    if isinstance(command, (rp.Start, rp.Resume)):
        return command.job_id != active_job
    return isinstance(command, rp.Load)
