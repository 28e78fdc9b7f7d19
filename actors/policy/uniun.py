"""The UNIUN policy: five strict tiers, a CFS fair pool, budgets, affinity (docs/scheduling.md).

Theory of operation. :meth:`UniunPolicy.decide` surveys the waiting jobs once (bucket
fronts, see :mod:`~uniun.actors.policy.tiers`) and files the best candidate of each
*rank*, in the order the picker prefers them::

    0 T0 chat (any model: swap-worthy)        5 T2 on another model (pays a swap)
    1 T1 foreground kind (swap-worthy)        6 T2 over budget, loaded model or starved
    2 T2 extract, loaded model or starved      7 T4 on another model (not in a chat idle gap)
    3 T3 deadline passed, EDF (swap-worthy)    8 T2 over budget, on another model
    4 T4 fair pool, loaded model or starved (CFS)

"Starved": waited longer than ``starvation_s`` for affinity; such a job is picked as if
its model were loaded. Ranks 6 and 8 make the picker work-conserving: T2 over budget
still runs rather than leave the runner idle, and rather than pay a swap for a fair-pool job
that has not yet waited out the starvation bound (a swap for one small job would cost more
than the budget is worth; after the bound, a batch of them goes at once). With the runner
free, the first non-empty rank runs. With a job running, the running job is ranked too: a
candidate of a better tier *and* a better rank preempts it (a chat yields only to another
client's chat, below; a T2 candidate waits until a running T4 job has had one slice); a
running T2 job over budget yields to anything that can run without a swap (or is starved or
swap-worthy); a running T4 job is re-examined at every slice boundary and yields if another
flow's vruntime is lower by more than the granularity. The policy never asks twice: after a
Preempt the job is STOPPING until the runner reports.

Background lifecycle: every non-chat dispatch carries a token grant (25 % of
max_new_tokens); a job that used its grant is HELD (snapshot kept) until lifecycle is
foreground again, then it goes to the front of its tier. A non-chat job that was
dispatched with a full budget when the app went to the background is paused (reason
``budget``) and re-queued at the front, so it continues under a grant.

Power (``power.py``, docs/device.md): background work (not chat, not T1) starts only while
the governor lets it and is paused (reason ``power``) when it says stop; each such
decision is a power note (a timeline mark).

Chats of different clients (T0, :mod:`~uniun.actors.policy.chatshare`): the client with
the least service goes first; a running chat is paused (reason ``slice``, re-queued at the
front of its client's chats) for another client's chat that goes before it, once the
client that took the runner that way has had ``chat_quantum_tokens`` tokens.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

from uniun.actors.policy.base import Clock, PolicyBase
from uniun.actors.policy.budget import T2Budget
from uniun.actors.policy.chatshare import ChatShare
from uniun.actors.policy.config import PolicyConfig
from uniun.actors.policy.decision import Decision, Idle, Preempt, Run
from uniun.actors.policy.fairpool import FairPool
from uniun.actors.policy.job import JobStatus, PolicyJob
from uniun.actors.policy.power import governed
from uniun.actors.policy.tiers import T0, T2, T3, T4, TIER_NAMES, TierIndex, tier_of

(R_CHAT, R_FG, R_T2, R_DEADLINE, R_FAIR, R_T2_SWAP, R_T2_OVER, R_FAIR_SWAP,
 R_T2_OVER_SWAP) = range(9)
RANK_TIER = (0, 1, 2, 3, 4, 2, 2, 4, 2)
# The pause reasons the policy asks for; "lifecycle" (the app went to the background
# during a full-budget dispatch) is "budget" on the wire.
# "chat_share" (the runner goes to another client's chat) is "slice": a fair share.
_WIRE_REASON = {"preempted": "preempted", "slice": "slice", "budget": "budget",
                "lifecycle": "budget", "power": "budget", "chat_share": "slice"}


class _Survey:
    """Best candidate per rank at one moment, and the times at which that may change."""

    __slots__ = ("best", "wakes", "has_t2", "throttled")

    def __init__(self) -> None:
        self.best: list[tuple[tuple[float, ...], PolicyJob] | None] = [None] * 9
        self.wakes: list[float] = []
        self.has_t2 = False
        self.throttled = 0  # background candidates the power governor held back

    def offer(self, rank: int, sort_key: tuple[float, ...], job: PolicyJob) -> None:
        current = self.best[rank]
        if current is None or sort_key < current[0]:
            self.best[rank] = (sort_key, job)

    def pick(self) -> tuple[int, PolicyJob] | None:
        for rank, entry in enumerate(self.best):
            if entry is not None:
                return rank, entry[1]
        return None

    def job(self, rank: int) -> PolicyJob | None:
        entry = self.best[rank]
        return None if entry is None else entry[1]


class UniunPolicy(PolicyBase):
    """The rules of docs/scheduling.md. See the module docstring for how a pick is made."""

    name = "uniun"

    def __init__(self, config: PolicyConfig | None = None, clock: Clock | None = None,
                 wall_clock: Clock | None = None) -> None:
        super().__init__(config, clock, wall_clock)
        now = self._clock()
        self._index = TierIndex()
        self._held: OrderedDict[str, PolicyJob] = OrderedDict()
        self._pool = FairPool(self.config, now)
        self._budget = T2Budget(self.config)
        self._last_chat_at = -math.inf
        self._last_chat_model: str | None = None
        self._power_holding = False  # the last survey held background work back
        self._share = ChatShare(self.config)
        # The client whose chats hold the runner, and its tokens since it took the runner
        # by pausing another client's chat (protected for the quantum, against thrashing).
        self._chat_holder: str | None = None
        self._held_tokens = 0
        self._switching = False  # a chat is being paused for another client's

    # --- the question ---------------------------------------------------------------------
    def decide(self) -> Decision:
        now = self._clock()
        self._pool.tick(now)
        run = self._running
        run_s, run_t2 = self._running_estimate(now)
        self._budget.update(now, run_s, run_t2)
        survey = self._survey(now)
        pick = survey.pick()
        if run is None:
            if pick is None:
                return Idle(self._wake(now, survey))
            rank, job = pick
            return self._dispatch(job, RANK_TIER[rank], now, survey)
        if run.kind == self.config.chat_kind:
            rival = self._chat_rival(run) if run.status is JobStatus.RUNNING else None
            if rival is not None:
                return self._preempt(run, rival, "chat_share", now, survey)
            return Idle(self._wake(now, survey))
        if run.status is not JobStatus.RUNNING:
            return Idle(self._wake(now, survey))
        if (self.lifecycle == "background" and run.grant is None
                and run.kind != self.config.chat_kind):
            # Dispatched in the foreground: pause it, it comes back with a grant.
            return self._preempt(run, None, "lifecycle", now, survey)
        if self._governed(run) and not self.power.may_continue(
                now, run_s, has_deadline=run.deadline_at is not None):
            self.power_notes.append((run.job_id, f"pause: {self.power.reason}"))
            return self._preempt(run, None, "power", now, survey)
        tier = self.tier(run, now)
        if pick is not None:
            rank, job = pick
            if (RANK_TIER[rank] < tier and rank < self._rank_running(tier)
                    and not self._within_first_slice(run, RANK_TIER[rank], tier, now)):
                return self._preempt(run, job, "preempted", now, survey)
            if tier == T2 and self._budget.blocked and rank < R_T2_OVER:
                return self._preempt(run, job, "budget", now, survey)
        if tier == T4 and run.segment_start is not None and (
                now - run.segment_start >= self.config.slice_s):
            rival = survey.job(R_FAIR)
            if rival is not None and rival.flow != run.flow:
                mine = self._pool.key(run.flow) + run_s / self.config.weight(run.flow)
                if self._pool.key(rival.flow) + self.config.granularity_s < mine:
                    return self._preempt(run, rival, "slice", now, survey)
        return Idle(self._wake(now, survey))

    def tier(self, job: PolicyJob, now: float) -> int:
        return tier_of(job, now=now, foreground=self.foreground, config=self.config)

    # --- picking --------------------------------------------------------------------------
    def _survey(self, now: float) -> _Survey:
        cfg = self.config
        chat, extract, fg = cfg.chat_kind, cfg.extract_kind, self.foreground
        loaded = self.loaded_model
        blocked = self._budget.blocked
        starved_before = now - cfg.starvation_s
        gap_end = self._last_chat_at + cfg.chat_idle_gap_s
        gap = loaded is not None and loaded == self._last_chat_model and now < gap_end
        survey = _Survey()
        power = self.power
        governed = power.mode != "normal"
        deadline_only = power.mode == "deadline_only"
        for bkey, bucket in self._index.buckets.items():
            kind = bkey.kind
            front = bucket.front()
            if kind == chat:
                survey.offer(R_CHAT, (*self._share.order(bkey.client), front.key), front)
                continue
            if kind == fg and (kind != extract or bkey.hint):
                survey.offer(R_FG, (front.key,), front)
                continue
            if governed and not power.may_start(now, has_deadline=front.deadline_at is not None):
                survey.throttled += 1
                continue
            same = bkey.model == loaded
            if not same:
                oldest = bucket.oldest_wait()
                same = oldest <= starved_before
                if not same:
                    survey.wakes.append(oldest + cfg.starvation_s)
            if kind == extract:
                survey.has_t2 = True
                if blocked:
                    survey.offer(R_T2_OVER if same else R_T2_OVER_SWAP, (front.key,), front)
                else:
                    survey.offer(R_T2 if same else R_T2_SWAP, (front.key,), front)
                continue
            sort_key = (self._pool.key(bkey.flow), front.key)
            if same:
                survey.offer(R_FAIR, sort_key, front)
            elif gap:
                survey.wakes.append(gap_end)
            else:
                survey.offer(R_FAIR_SWAP, sort_key, front)
        for kind in self._index.deadline_kinds():
            if kind in (chat, extract) or kind == fg:
                continue
            # Low battery runs deadline work only: then any deadline counts, due or not.
            job = self._index.earliest_overdue(kind, math.inf if deadline_only else now)
            if job is not None:
                if governed and not power.may_start(now, has_deadline=True):
                    survey.throttled += 1
                    continue
                survey.offer(R_DEADLINE, (job.deadline_at or 0.0, job.key), job)
        promotion = self._index.next_promotion(now)
        if promotion is not None:
            survey.wakes.append(promotion)
        if (holding := survey.throttled > 0) != self._power_holding:
            self._power_holding = holding
            what = "hold" if holding else "release"
            self.power_notes.append((None, f"{what} background: {power.reason}"))
        return survey

    def _governed(self, job: PolicyJob) -> bool:
        return governed(job, self.config, self.foreground)

    def _chat_rival(self, run: PolicyJob) -> PolicyJob | None:
        """Another client's chat the running chat yields to, after its quantum."""
        if self._held_tokens < self.config.chat_quantum_tokens:
            return None
        chat = self.config.chat_kind
        return self._share.rival(run.client, ((key.client, bucket.front())
                                              for key, bucket in self._index.buckets.items()
                                              if key.kind == chat))

    def _within_first_slice(self, run: PolicyJob, pick_tier: int, tier: int,
                            now: float) -> bool:
        """A fair-pool job runs at least one slice before T2 takes the runner back, so
        that budget swings (see budget.py) cannot make the two trade every token."""
        return (pick_tier == T2 and tier == T4 and (
            run.segment_start is None or now - run.segment_start < self.config.slice_s))

    def _rank_running(self, tier: int) -> int:
        if tier == T2:
            return R_T2_OVER if self._budget.blocked else R_T2
        return (R_CHAT, R_FG, R_T2, R_DEADLINE, R_FAIR)[tier]

    def _running_estimate(self, now: float) -> tuple[float, bool]:
        """Seconds the running job has used since its last report, and whether it is T2."""
        run = self._running
        if run is None or run.last_report_at is None:
            return 0.0, False
        return max(0.0, now - run.last_report_at), run.dispatch_tier == T2

    def _wake(self, now: float, survey: _Survey) -> float | None:
        times = list(survey.wakes)
        run = self._running
        run_s, run_t2 = self._running_estimate(now)
        if (run is not None and run.status is JobStatus.RUNNING
                and run.segment_start is not None and self.tier(run, now) == T4
                and (survey.best[R_FAIR] is not None or survey.has_t2)):
            slice_s = self.config.slice_s
            done = math.floor((now - run.segment_start) / slice_s) + 1
            times.append(run.segment_start + done * slice_s)
        if survey.has_t2 or (run_t2 and len(self._index) > 0):
            change = self._budget.next_change(now, run_s, run_t2, run is not None)
            if change is not None:
                times.append(change)
        governed_run = run is not None and self._governed(run)
        if survey.throttled or governed_run:
            change = self.power.next_change(now, run_s if governed_run else 0.0,
                                            governed_run)
            if change is not None:
                times.append(change)
        later = [t for t in times if t > now]
        return min(later) if later else None

    # --- acting ----------------------------------------------------------------------------
    def _dispatch(self, job: PolicyJob, tier: int, now: float, survey: _Survey) -> Run:
        self._index.remove(job)
        grant = None
        if self.lifecycle == "background" and job.kind != self.config.chat_kind:
            share = math.ceil(self.config.background_grant * job.spec.max_new_tokens)
            grant = max(1, min(share, job.spec.max_new_tokens - job.tokens))
        resume = job.dispatches > 0
        if self.power.mode != "normal" and self._governed(job):
            self.power_notes.append((job.job_id, f"run: {self.power.reason}, "
                                                 f"{self.power.level(now):.1f} s saved"))
        client = job.client if job.kind == self.config.chat_kind else None
        if client != self._chat_holder:
            self._chat_holder = client
            self._held_tokens = 0 if self._switching else self.config.chat_quantum_tokens
        self._switching = False
        swap = self._dispatched(job, now, tier, grant)
        # The survey from before the pick still gives safe wake times: nothing new can
        # fall due before the host reports on_started and asks again, and an early
        # wake only costs an Idle answer.
        return Run(job_id=job.job_id, model_id=job.model_id, resume=resume, swap=swap,
                   token_grant=grant, tier=tier, wake_at=self._wake(now, survey))

    def _preempt(self, run: PolicyJob, for_job: PolicyJob | None, reason: str,
                 now: float, survey: _Survey) -> Preempt:
        run.move("preempt")
        run.stop_reason = reason
        self._switching = reason == "chat_share"
        self.preemptions += 1
        return Preempt(running_job_id=run.job_id,
                       for_job_id=None if for_job is None else for_job.job_id,
                       reason=_WIRE_REASON[reason],  # type: ignore[arg-type]
                       wake_at=self._wake(now, survey))

    # --- hooks of PolicyBase ---------------------------------------------------------------
    def _fair(self, job: PolicyJob) -> bool:
        return job.kind not in (self.config.chat_kind, self.config.extract_kind)

    def _enqueue(self, job: PolicyJob, *, front: bool) -> None:
        self._index.add(job, front=front, extract_kind=self.config.extract_kind,
                        chat_kind=self.config.chat_kind)

    def _dequeue(self, job: PolicyJob) -> None:
        if job.status is JobStatus.HELD:
            del self._held[job.job_id]
        else:
            self._index.remove(job)

    def _arrived(self, job: PolicyJob, now: float) -> None:
        if self._fair(job):
            self._pool.place(job.flow, now)
        elif job.kind == self.config.chat_kind:
            self._last_chat_at, self._last_chat_model = now, job.model_id
            self._share.arrive(job.client)

    def _served(self, job: PolicyJob, prompt_tokens: int, tokens: int) -> None:
        if job.kind == self.config.chat_kind:
            self._share.charge(job.client, prompt_tokens=prompt_tokens, tokens=tokens)
            if job.client == self._chat_holder:
                self._held_tokens += tokens

    def _requeue_chat(self, job: PolicyJob) -> bool:
        return job.stop_reason == "chat_share"

    def _charged(self, job: PolicyJob, runner_s: float, now: float) -> None:
        if self._fair(job):
            self._pool.account(job.flow, runner_s)
        self._budget.charge(now, runner_s, job.dispatch_tier == T2)
        if self._governed(job):
            self.power.charge(runner_s, now)

    def _ended(self, job: PolicyJob, now: float) -> None:
        if self._fair(job):
            self._pool.leave(job.flow, now)
        elif job.kind == self.config.chat_kind:
            self._last_chat_at, self._last_chat_model = now, job.model_id
            self._share.leave(job.client)

    def _hold(self, job: PolicyJob, reason: str) -> bool:
        # Held only when the runner stopped at the end of a background grant.
        held = (self.lifecycle == "background" and job.kind != self.config.chat_kind
                and job.grant is not None and job.stop_reason is None
                and reason == "budget")
        if held:
            self._held[job.job_id] = job
        return held

    def _lifecycle_changed(self, state: str) -> None:
        if state == "background":
            return  # decide() pauses a running full-budget job; new dispatches get grants
        now = self._clock()
        for job in reversed(list(self._held.values())):  # front-insert keeps their order
            job.move("release")
            job.waiting_since = now
            self._enqueue(job, front=True)
        self._held.clear()

    def chat_counters(self) -> dict[str, float]:
        """Each client's virtual token counter (T0's fair shares), for tests and tools."""
        return dict(self._share.counter)

    # --- status ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        now = self._clock()
        self._pool.tick(now)
        tiers: list[list[tuple[tuple[float, ...], str]]] = [[] for _ in TIER_NAMES]
        for job in self._index.jobs():
            tier = self.tier(job, now)
            if tier == T0:
                order: tuple[float, ...] = (*self._share.order(job.client), job.key)
            elif tier == T3:
                order = (job.deadline_at or 0.0, job.key)
            elif tier == T4:
                order = (self._pool.key(job.flow), job.key)
            else:
                order = (job.key,)
            tiers[tier].append((order, job.job_id))
        run_s, run_t2 = self._running_estimate(now)
        blocked = self._budget.update(now, run_s, run_t2)  # as decide() would see it now
        return {
            "policy": self.name,
            "lifecycle": self.lifecycle,
            "foreground": self.foreground,
            "loaded_model": self.loaded_model,
            "running": None if self._running is None else self._running.summary(),
            "queues": {name: [job_id for _, job_id in sorted(entries)]
                       for name, entries in zip(TIER_NAMES, tiers)},
            "held": list(self._held),
            "vruntime": dict(self._pool.vruntime),
            "min_vruntime": self._pool.min_vruntime,
            "chat_clients": self._share.active(),  # not their names: they are addresses
            "t2_share": self._budget.share(now, run_s, run_t2),
            "t2_blocked": blocked,
            "swaps": self.swaps,
            "preemptions": self.preemptions,
        }
