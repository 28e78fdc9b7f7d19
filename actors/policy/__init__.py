"""The scheduling policy: pure, clock-injected, no I/O (docs/scheduling.md).

No sockets, threads, models or actor library here: the scheduler process hosts a policy
object and drives it; tests drive it with a fake clock; the trace simulator drives it
with a simulated runner. Imports flow one way: nothing here imports pykka, zmq or
onnxruntime.

How a host drives it::

    policy = make_policy("uniun" | "fcfs", config: PolicyConfig | None = None,
                         clock=time.monotonic, wall_clock=time.time)

    # inputs (client messages); each may raise InvalidField (naming the field) and then
    # changes nothing
    tier = policy.submit(spec: JobSpec, *, arrival=None, deadline_at=None,
                         client=None) -> int   # client: T0's fair-share key
    policy.cancel(job_id) -> CancelOutcome     # REMOVED | STOP_RUNNING | NOT_FOUND
    policy.set_foreground(kind: str | None)
    policy.set_lifecycle("foreground" | "background")

    # the one question, asked after every input, every report and when the timer fires
    decision = policy.decide()   # Idle | Run | Preempt, each with .wake_at (or None)

    # runner reports (runner_seconds: seconds consumed since the previous report)
    policy.on_model_loaded(model_id)
    policy.on_started(job_id, prompt_tokens=0)
    policy.on_tokens(job_id, n_new_tokens, runner_seconds)
    policy.on_paused(job_id, runner_seconds, reason) -> ReportOutcome
    policy.on_finished(job_id, runner_seconds)
    policy.on_failed(job_id, runner_seconds, *, requeue=False) -> ReportOutcome
    policy.on_cancelled(job_id, runner_seconds)

    policy.status() -> dict   # policy, lifecycle, foreground, loaded_model, running,
                              # queues {"T0".."T4": ids in pick order}, held, vruntime,
                              # t2_share, swaps, preemptions

Contract with the host:
- ``Run`` is a command: the job is "running" from that moment (the host swaps first when
  ``swap``; it resumes, never restarts, when ``resume``; it passes ``token_grant`` to the
  runner, which stops itself there and reports ``on_paused(..., "budget")``; a job
  running with a full budget when the app goes to the background gets a ``Preempt``
  with reason ``"budget"`` and comes back with a grant).
- ``Preempt``: ask the runner to pause at the next token boundary. The job stays running
  until ``on_paused`` (or ``on_finished``, if it finished first); ``decide()`` will not
  ask again. A chat is preempted only for another client's chat (reason ``"slice"``).
- ``on_paused`` of a chat the policy paused for another client's chat re-queues it
  (``REQUEUED``: it resumes from its snapshot); any other pause of a chat (but its own
  cancel) ends it: ``ReportOutcome.CHAT_INTERRUPTED`` -> send the client a retryable
  error, never re-run.
- ``cancel`` of a running job returns ``STOP_RUNNING``: tell the runner, then report
  ``on_cancelled`` (``on_paused`` counts as cancelled too).
- Reports for a job that is not on the runner raise :class:`IllegalTransition` or
  :class:`UnknownJob` and change nothing (host bugs, not client errors).
- Time: ``clock`` is the policy's time (monotonic); the wire's ``deadline`` is unix
  seconds and is converted once at submit: ``clock() + (deadline - wall_clock())``.
  ``wake_at`` is on the policy clock: arm one timer for it, call ``decide()`` when it
  fires (a stale timer is harmless: ``decide()`` then answers ``Idle``).
- The policy does not log; the host logs each decision with the job id bound.
"""

from uniun.actors.policy.base import PolicyBase
from uniun.actors.policy.config import PolicyConfig
from uniun.actors.policy.decision import (
    PAUSE_REASONS,
    CancelOutcome,
    Decision,
    Idle,
    PauseReason,
    Preempt,
    ReportOutcome,
    Run,
)
from uniun.actors.policy.factory import POLICIES, make_policy
from uniun.actors.policy.fcfs import FcfsPolicy
from uniun.actors.policy.job import (
    DuplicateJob,
    IllegalTransition,
    JobStatus,
    PolicyError,
    PolicyJob,
    UnknownJob,
)
from uniun.actors.policy.tiers import TIER_NAMES, tier_of
from uniun.actors.policy.uniun import UniunPolicy

Policy = PolicyBase

__all__ = [
    "CancelOutcome", "Decision", "DuplicateJob", "FcfsPolicy", "Idle", "IllegalTransition",
    "JobStatus", "PAUSE_REASONS", "POLICIES", "PauseReason", "Policy", "PolicyBase",
    "PolicyConfig", "PolicyError", "PolicyJob", "Preempt", "ReportOutcome", "Run",
    "TIER_NAMES", "UniunPolicy", "UnknownJob", "make_policy", "tier_of",
]
