"""The policy runner: one call per operator cycle turns job summaries into decisions and actions.

``PolicyRunner.run_cycle(summaries, now=..., act=...)`` is the whole interface the operator
loop needs. Per job and policy it evaluates (pure, :mod:`auditor.policy.evaluate`), keeps the
violation's escalation state in the store, claims the due step under its dedup key, and only
then runs the step's actions. With ``act=False`` nothing is written anywhere: the decisions say
what would happen.

The runner decides; the rest is in modules of their own: :mod:`auditor.policy.dispatch` carries
out a claimed step's actions, :mod:`auditor.policy.alerts` renders what they say,
:mod:`auditor.policy.recovery` finds due reactivations and interrupted steps, and
:mod:`auditor.policy.record` is the port onto the escalation record (the store's decision log).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable, Sequence

from auditor.core.action_target import ActionTarget
from auditor.core.identity import JobKey
from auditor.core.job_snooze import JobSnooze
from auditor.core.job_summary import JobSummary
from auditor.core.model import Verdict, Window
from auditor.core.violations import CLAIMED, DONE, QUEUED, SKIPPED
from auditor.errors import AuditorError, BadInput
from auditor.policy.alerts import alert_buttons as alert_buttons  # re-exported
from auditor.policy.alerts import slack_message as slack_message  # re-exported
from auditor.policy.decision import Decision
from auditor.policy.dispatch import NO_DESTINATION as NO_DESTINATION  # re-exported
from auditor.policy.dispatch import StepActions, maybe_delivered
from auditor.policy.escalation import (
    LadderSnoozes,
    ViolationState,
    action_key,
    decision_key,
    due_step,
    job_key,
)
from auditor.policy.evaluate import Evaluation, JobFacts, evaluate, verdict_may_match
from auditor.policy.loader import PolicyRegistry
from auditor.policy.record import EscalationRecord, LineageMfu, lineage_best
from auditor.policy.recovery import Recovery
from auditor.policy.runner_config import RequeueSettings as RequeueSettings  # re-exported
from auditor.policy.runner_config import Route as Route  # re-exported
from auditor.policy.runner_config import RunnerConfig
from auditor.policy.schema import ActionKind, Mode, Policy

if TYPE_CHECKING:
    from auditor.ports import CheckRequeue, ClusterActions

log = logging.getLogger(__name__)

#: the actions that tell the user; one must have succeeded before the ladder moves on
_TELLS = (ActionKind.NOTIFY, ActionKind.EVENT)

#: read this much before a sustained window, so its first bucket is whole whatever the width
_READ_MARGIN = timedelta(hours=1)


class PolicyRunner:
    """Evaluate policies each cycle and (with ``act``) carry out their escalation.

    Args:
        policies: a :class:`PolicyRegistry` (hot-reloaded by its owner), or a fixed list.
        store: the :class:`~auditor.store.Store`; required to act (it holds the dedup keys)
            and for ``sustained`` conditions (they read the stored buckets).
        kube: the cluster actions port (:class:`~auditor.ports.ClusterActions`; the operator's is
            :class:`~auditor.actions.KubeActions`), or None (no Kubernetes: annotate, event and
            requeue are recorded as skipped; label selectors and opt-out annotations match nothing).
        config: routing, requeue settings, retry policy of the notifiers.
        record: the escalation record (:class:`~auditor.policy.record.EscalationRecord`); by
            default the store's decision log. A fake of it runs the runner without a database.
        check_requeue: the requeue through the efficiency gate's AdmissionCheck
            (:class:`~auditor.ports.CheckRequeue`), tried first for a running Workload; None:
            requeues always go through ``spec.active``.
        lineage: the lineages' history for a ``lineage`` condition
            (:class:`~auditor.policy.record.LineageMfu`); by default the store (None without one:
            a lineage condition then never fires).
        snoozes: the jobs whose ladder their owner paused (:class:`~auditor.policy.escalation.LadderSnoozes`,
            issue 30); by default the store's. No step is taken on a snoozed job.
    """

    def __init__(
        self,
        policies: PolicyRegistry | Sequence[Policy],
        store: Any | None = None,
        kube: "ClusterActions | None" = None,
        config: RunnerConfig | None = None,
        *,
        sleep: Callable[[float], None] | None = None,
        record: EscalationRecord | None = None,
        check_requeue: "CheckRequeue | None" = None,
        lineage: LineageMfu | None = None,
        snoozes: LadderSnoozes | None = None,
    ) -> None:
        self._policies = policies
        self.store = store
        #: the lineages' best MFU (the ``lineage`` condition); by default the store's
        self.lineage: LineageMfu | None = lineage or (store if hasattr(store, "lineage_best_mfu") else None)
        self.kube = kube
        self.config = config or RunnerConfig()
        if snoozes is None and hasattr(store, "job_snoozes"):
            snoozes = store.job_snoozes()  # type: ignore[union-attr]
        #: the paused ladders (read once a cycle); None: nothing is ever paused
        self.snoozes: LadderSnoozes | None = snoozes
        if record is None and store is not None:
            record = store.decision_log()
        self._repo = record
        if record is not None:
            self._actions = StepActions(record, kube, self.config, sleep, check_requeue)
            self._recovery = Recovery(record, kube, self.config, self._actions, lambda: self.policies)

    @property
    def record(self) -> EscalationRecord | None:
        """The escalation record (the delivery queue of alerts lives in it)."""
        return self._repo

    @property
    def policies(self) -> list[Policy]:
        p = self._policies
        return list(p.policies) if isinstance(p, PolicyRegistry) else list(p)

    # ------------------------------------------------------------------ the cycle

    def run_cycle(self, summaries: Sequence[JobSummary], *, now: datetime, act: bool) -> list[Decision]:
        """Evaluate every policy on every summary; with ``act``, run the due escalation steps.

        Returns one :class:`Decision` per (job, policy) that fired (including those blocked by a
        snooze or still waiting for a cooldown: ``step`` is None then), plus the requeue
        reactivations that came due. Never raises for one job's failure: the error is recorded
        in that decision's ``results``.
        """
        if act and self._repo is None:
            raise BadInput("acting on policies needs a store (it keeps the dedup keys)")
        policies = self.policies
        out: list[Decision] = []
        # one read of the paused ladders for the whole cycle (every cluster's: a summary may name
        # another cluster than the runner's, and the keys are whole identities)
        paused = self.snoozes.in_force(now) if self.snoozes is not None and (act or summaries) else {}
        if act:
            self._actions.new_cycle()
            out += self._recovery.resume(now, resume_steps=not self.config.audit_only, paused=paused.keys())
        # the installation's audit mode: decide as a dry run does, the ladders stay where they are
        # (a step "taken" in audit would let enforce later skip the steps that tell the user)
        act = act and not self.config.audit_only
        jobs = []
        for s in summaries:
            if not s.cluster:
                s = replace(s, key=replace(s.key, cluster=self.config.cluster))
            jobs.append((s, s.to_json()))  # the document: what the actions, alerts and the record are given
        # one read of the lineages' best MFU for the whole cycle, only when a policy needs it
        best = lineage_best(self.lineage, [d for _, d in jobs]) if any(p.spec.lineage for p in policies) else {}
        for s, summary in jobs:
            try:
                out += self._job(
                    s, summary, policies, now=now, act=act, best=best.get(str(s.key)), paused=paused.get(s.key)
                )
            except AuditorError as exc:
                log.warning("policies on %s: %s", job_key(summary), exc)
                out.append(
                    Decision(
                        "*",
                        "-",
                        job_key(summary),
                        s.verdict.value,
                        f"error: {exc}",
                        {},
                        results={"error": str(exc)},
                    )
                )
        return out

    def _job(
        self,
        s: JobSummary,
        summary: dict,
        policies: list[Policy],
        *,
        now: datetime,
        act: bool,
        best: float | None,
        paused: JobSnooze | None = None,
    ) -> list[Decision]:
        if s.verdict is Verdict.INSUFFICIENT_DATA or not policies:
            return []  # nothing happens on insufficient data: not even closing a violation
        facts = JobFacts()
        # Kubernetes is asked only when some policy can fire on this verdict (two GETs per job)
        if self.kube is not None and any(verdict_may_match(p, s) for p in policies):  # its GPUs' too
            facts = self.kube.facts(ActionTarget.of_summary(s))
        buckets = None
        if any(p.spec.sustained for p in policies):
            buckets = self._buckets(s, policies, now)
        job = JobKey.of_document(summary)
        decisions: list[Decision] = []
        for policy in policies:
            ev = evaluate(policy, s, now=now, facts=facts, buckets=buckets, lineage_best=best)
            if ev.exempt:
                continue
            if not ev.fires:
                if ev.judged and act and self._repo is not None:
                    if self._repo.close_violation(job, policy.name, now):
                        log.info("%s: %s no longer fires; violation closed", job_key(summary), policy.name)
                continue
            decisions.append(self._step(policy, s, summary, ev, job, now=now, act=act, paused=paused))
        return decisions

    def _buckets(self, s: JobSummary, policies: list[Policy], now: datetime) -> list | None:
        if self.store is None:
            return None
        found = self.store.find_job(s.namespace, s.key.kind, s.key.name, s.cluster)
        if found is None:
            return None
        longest = max(p.spec.sustained.duration for p in policies if p.spec.sustained)
        # only the trailing windows, which end at the job's last bucket: the warm-up is judged
        # from the summary's start, so the read (by job and time, indexed) costs the same for a
        # job of an hour and one of a month
        last = min(now, s.end)
        return self.store.buckets(found[0], Window(last - longest - _READ_MARGIN, now + timedelta(seconds=1)))

    def _step(
        self,
        policy: Policy,
        s: JobSummary,
        summary: dict,
        ev: Evaluation,
        job: Any,
        *,
        now: datetime,
        act: bool,
        paused: JobSnooze | None = None,
    ) -> Decision:
        mode = policy.spec.mode
        target = ActionTarget.of_summary(s)
        d = Decision(
            policy.name,
            mode.value,
            job_key(summary),
            summary.get("verdict"),
            ev.reason,
            ev.evidence,
            blocked=ev.blocked,
        )
        repo = self._repo
        if repo is not None:
            open_ = repo.open_violations(job, policy.name)
            state = open_[0][2] if open_ else None
        else:
            state = None
        if ev.snoozed:
            return d
        if paused is not None:
            # the owner paused this job's ladder (issue 30): no step, no alert again, no requeue;
            # the violation stays as it is, so the ladder goes on from here when the snooze ends
            d.blocked = paused.text()
            return d
        if state is None:
            if not act:
                state = ViolationState(None, 1, now, 0, None)
            else:
                state = repo.open_violation(job, policy.name, now, ev.evidence, summary.get("uid"))  # type: ignore[union-attr]
        due = due_step(policy, state, now)
        if due is None:
            return d
        idx, step = due
        d.step, d.actions = idx, [a.value for a in step.actions]
        d.dedup_key = decision_key(summary, policy.name, state.episode, idx)
        d.dry_run = not act or mode is Mode.AUDIT
        if act and not d.dry_run and idx > 0:
            untold = self._owner_not_told(policy, s, state, idx, target, ev, now)
            if untold:
                d.blocked = untold
                return d  # not claimed: the ladder stays on this step until the alert is delivered
        if ActionKind.REQUEUE in step.actions and mode is Mode.ENFORCE and act:
            why = self._requeue_blocked(policy, summary, job, now)
            if why:
                d.results["requeue"] = {"state": "deferred", "why": why}
                if why.startswith("rate limit"):
                    d.blocked = why
                    return d  # not claimed: retried next cycle when the rate allows
        if not act:
            return d
        keys = [action_key(d.dedup_key, a) for a in d.actions]
        evidence = {**ev.evidence, "job_ref": target.to_ref(), "policy_mode": mode.value}
        did = repo.claim_step(  # type: ignore[union-attr]
            job,
            policy.name,
            state,
            idx,
            dedup_key=d.dedup_key,
            mode=mode.value,
            action_names=d.actions,
            action_keys=keys,
            now=now,
            dry_run=d.dry_run,
            verdict=str(summary.get("verdict")),
            reason=ev.reason,
            evidence=evidence,
        )
        if did is None:
            d.results["claimed"] = False  # another replica or an earlier run took this step
            return d
        if d.dry_run:
            return d
        for action, key in zip(step.actions, keys):
            d.results[action.value] = self._actions.run(
                action, key, policy, target, ev.reason, ev.evidence, now, summary=s
            )
        return d

    def _owner_not_told(
        self,
        policy: Policy,
        s: JobSummary,
        state: ViolationState,
        idx: int,
        target: ActionTarget,
        ev: Evaluation,
        now: datetime,
    ) -> str | None:
        """Why step ``idx`` must wait for an earlier step that tells the user (an alert, an
        Event) of this violation, or None: the schema puts one before every requeue, and it
        must have succeeded before the ladder moves on.

        An alert not yet delivered (queued) holds the ladder; a failed alert or Event is tried
        again now (an alert's channels that delivered are not) and holds it until it succeeds.
        An alert that may have arrived (a receiver without an idempotency key gave no answer)
        is not sent again: it lets later steps run, except one that stops the job, which needs
        a confirmed alert. An alert with no destination (recorded skipped, and counted) holds
        nothing.
        """
        assert self._repo is not None
        steps = policy.spec.escalation
        stops = policy.spec.mode is Mode.ENFORCE and ActionKind.REQUEUE in steps[idx].actions
        summary = s.to_json()
        keys = {
            action_key(decision_key(summary, policy.name, state.episode, j), a.value): (j, a)
            for j in range(idx)
            for a in steps[j].actions
            if a in _TELLS
        }
        rows = self._repo.action_rows(keys) if keys else {}
        for key, (j, action) in keys.items():
            row = rows.get(key)
            what = "alert" if action is ActionKind.NOTIFY else "Event"
            if row is None or row.state in (DONE, SKIPPED):
                continue
            if row.state in (CLAIMED, QUEUED):
                return f"waiting: the {what} of step {j} is not delivered yet"
            if maybe_delivered(row.result):
                if stops:
                    return (
                        f"waiting: the {what} of step {j} may not have arrived ({row.error}); "
                        "a step that stops the job needs a confirmed alert"
                    )
                continue
            again = self._actions.run(
                action, key, policy, target, ev.reason, ev.evidence, now, summary=s, before=row.result
            )
            if again["state"] == DONE:
                log.info("%s: the %s of step %d succeeded on a new try", target.key, what, j)
                continue
            if again["state"] == QUEUED:
                return f"waiting: the {what} of step {j} failed and is queued again"
            return f"waiting: the {what} of step {j} failed again ({again.get('error') or again.get('why')})"
        return None

    def _requeue_blocked(self, policy: Policy, summary: dict, job: Any, now: datetime) -> str | None:
        why = self.config.requeue.allows(summary)
        if why:
            return why
        assert self._repo is not None
        if self._repo.count_job_actions(job, "requeue") >= policy.spec.requeue.max_per_job:
            return f"cap of {policy.spec.requeue.max_per_job} requeue(s) per job reached"
        if (
            self._repo.count_actions("requeue", since=now - timedelta(hours=1), cluster=summary.get("cluster"))
            >= self.config.requeue.max_per_hour
        ):
            return f"rate limit: {self.config.requeue.max_per_hour} requeues per hour in the cluster"
        return None
