"""Due work the runner finds in the escalation record at the start of a cycle: requeued jobs
whose backoff is over go back to their queue, and steps a crash interrupted are finished (an
alert is never sent twice; a Kubernetes action, idempotent, runs again)."""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable, Collection

from auditor.core.action_target import ActionTarget
from auditor.core.identity import JobKey
from auditor.core.violations import DONE, FAILED, WAITING
from auditor.errors import AuditorError
from auditor.policy.decision import Decision
from auditor.policy.dispatch import StepActions
from auditor.policy.record import EscalationRecord
from auditor.policy.runner_config import RunnerConfig
from auditor.policy.schema import ActionKind, Policy

if TYPE_CHECKING:
    from auditor.ports import ClusterActions

log = logging.getLogger("auditor.policy.runner")


class Recovery:
    """Reactivations and interrupted steps of one cluster (``config.cluster``)."""

    def __init__(
        self,
        record: EscalationRecord,
        kube: "ClusterActions | None",
        config: RunnerConfig,
        actions: StepActions,
        policies: Callable[[], list[Policy]],
    ) -> None:
        self._record = record
        self.kube = kube
        self.config = config
        self._actions = actions
        self._policies = policies

    def _requeue_due(self, row: Any, now: datetime) -> tuple[datetime | None, dict]:
        """When a requeued job goes back to its queue, and the row's result as now known.

        The backoff counts from the release of the job's quota, as Kueue signals it
        (``QuotaReserved`` turning False once the evicted job has no active pods), first seen by
        a cycle; never earlier than our patch plus the backoff. A Workload that still holds its
        quota after twice the backoff goes back all the same, so a job that never stops is not
        held for ever. None: not due, and nothing to say yet (the Workload could not be read).
        """
        repo = self._record
        assert self.kube is not None and row.due_at is not None
        res = dict(row.result)
        if res.get("type") != "workload" or res.get("quota_released_at") or "backoff_s" not in res:
            return row.due_at, res
        backoff = timedelta(seconds=float(res["backoff_s"]))
        try:
            held = self.kube.holds_quota(res)
        except AuditorError as exc:
            log.warning(
                "requeue of %s/%s: cannot read its Workload (%s); trying again next cycle",
                res.get("namespace"),
                res.get("name"),
                exc,
            )
            return (row.due_at if now >= row.due_at + backoff else None), res
        if held:
            return (row.due_at if now >= row.due_at + backoff else None), res
        due = max(row.due_at, now + backoff)
        res.update(quota_released_at=now.isoformat(), reactivate_at=due.isoformat())
        repo.finish_action(row.dedup_key, WAITING, now, result=res, due_at=due)
        if due != row.due_at:
            self._show_reactivate_at(row, due)
        return due, res

    def _show_reactivate_at(self, row: Any, at: datetime) -> None:
        """Keep the job's ``gpu-auditor.io/reactivate-at`` true when the time moves (a late quota
        release, a cycle after the due time): users read it to know when their job goes back. A
        failed write is logged, never fatal: the store's row is what the operator acts on."""
        assert self.kube is not None
        try:
            self.kube.annotate(
                ActionTarget(key=JobKey(row.job.cluster, row.job.namespace, row.job.kind, row.job.name)),
                {"gpu-auditor.io/reactivate-at": at.isoformat().replace("+00:00", "Z")},
            )
        except AuditorError as exc:
            log.warning(
                "requeue of %s/%s: cannot update gpu-auditor.io/reactivate-at (%s)",
                row.job.namespace,
                row.job.name,
                exc,
            )

    def resume(self, now: datetime, *, resume_steps: bool = True, paused: Collection[JobKey] = ()) -> list[Decision]:
        """Reactivate requeued jobs whose backoff is over; finish steps a crash interrupted (unless
        not ``resume_steps``: the installation's audit mode, which lets them wait for enforce).
        An interrupted step of a job in ``paused`` (its owner snoozed its escalation, issue 30)
        waits for the snooze's end: it would otherwise requeue a snoozed job; a reactivation
        still runs (it undoes our own write)."""
        repo = self._record
        out: list[Decision] = []
        for row in repo.actions_in([WAITING], cluster=self.config.cluster, action="requeue"):
            if row.due_at is None or self.kube is None:
                continue
            due, result = self._requeue_due(row, now)
            if due is None or due > now:
                continue
            row = dataclasses.replace(row, result=result, due_at=due)
            if not repo.take_action(row.dedup_key, WAITING, "reactivating", now):
                continue  # another replica is on it
            key = f"{row.job.cluster}/{row.job.namespace}/{row.job.kind}/{row.job.name}"
            d = Decision(
                row.policy,
                "enforce",
                key,
                None,
                "requeue backoff over: reactivate",
                {},
                dry_run=False,
                dedup_key=row.dedup_key,
                actions=["reactivate"],
            )
            try:
                res = self.kube.reactivate(row.result)
                repo.finish_action(
                    row.dedup_key,
                    DONE,
                    now,
                    result={**row.result, "reactivated": res, "reactivated_at": now.isoformat()},
                )
                d.results["reactivate"] = {"state": DONE, **res}
                if now != due and not res.get("gone"):
                    self._show_reactivate_at(row, now)
            except AuditorError as exc:
                # put it back: the next cycle tries again (reactivation must not be lost)
                repo.finish_action(row.dedup_key, WAITING, now, result=row.result, error=str(exc), due_at=row.due_at)
                d.results["reactivate"] = {"state": "retry", "error": str(exc)}
            out.append(d)
        if not resume_steps:
            return out
        policies = {p.name: p for p in self._policies()}
        for row in repo.stale_claims(now, self.config.stale_claim_after, cluster=self.config.cluster):
            if row.job in paused:
                continue  # snoozed: resumed in the first cycle after the snooze
            decision = next((x for x in repo.decisions(job=row.job) if x["id"] == row.decision_id), None)
            policy = policies.get(row.policy)
            if decision is None or policy is None:
                repo.finish_action(row.dedup_key, FAILED, now, error="interrupted; policy gone")
                continue
            if row.action == ActionKind.NOTIFY.value:
                # at most once for people: a maybe-sent alert is not sent again
                repo.finish_action(
                    row.dedup_key,
                    FAILED,
                    now,
                    result={**row.result, "maybe_delivered": True},
                    error="interrupted before its result was recorded; not resent",
                )
                continue
            try:
                target = ActionTarget.of_ref(decision["evidence"].get("job_ref") or {})
            except ValueError as exc:
                repo.finish_action(row.dedup_key, FAILED, now, error=f"interrupted; stored job_ref unusable ({exc})")
                continue
            d = Decision(
                row.policy,
                policy.spec.mode.value,
                str(target.key),
                target.verdict,
                "resumed after an interruption",
                {},
                dry_run=False,
                dedup_key=row.dedup_key,
                actions=[row.action],
            )
            d.results[row.action] = self._actions.run(
                ActionKind(row.action), row.dedup_key, policy, target, decision["reason"], decision["evidence"], now
            )
            out.append(d)
        return out
