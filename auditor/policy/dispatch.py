"""Carrying out a claimed policy step: each action (notify, annotate, event, requeue) runs here
and its outcome is recorded on the action's row, so a crash between the two is found by the
runner's recovery (:mod:`auditor.policy.recovery`)."""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable

from auditor.core.action_target import ActionTarget
from auditor.core.identity import JobKey
from auditor.core.job_summary import JobSummary
from auditor.core.lineage import lineage_of_summary
from auditor.core.violations import DONE, FAILED, SKIPPED, WAITING
from auditor.errors import AuditorError, RequeueRefused
from auditor.notify import SlackNotifier, WebhookNotifier
from auditor.policy.alerts import event_note, job_annotations, slack_message, webhook_payload
from auditor.policy.record import EscalationRecord
from auditor.policy.runner_config import Route, RunnerConfig
from auditor.policy.schema import ActionKind, Mode, Policy

if TYPE_CHECKING:
    from auditor.ports import ClusterActions

log = logging.getLogger("auditor.policy.runner")

#: ``reason`` of a notification recorded as skipped because its team has no destination
NO_DESTINATION = "no_destination"


class StepActions:
    """The side effects of policy steps, each recorded on its action row in ``record``."""

    def __init__(
        self,
        record: EscalationRecord,
        kube: "ClusterActions | None",
        config: RunnerConfig,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self._record = record
        self.kube = kube
        self.config = config
        self._sleep = sleep
        #: teams already warned about having no alert destination (once per team and process)
        self._unrouted: set[str] = set()

    def run(
        self,
        action: ActionKind,
        key: str,
        policy: Policy,
        target: ActionTarget,
        reason: str,
        evidence: dict,
        now: datetime,
        *,
        summary: JobSummary | None = None,
    ) -> dict:
        """Carry out ``action`` on ``target`` and record its outcome. ``summary`` is the job's
        summary in a cycle; a resumed step has only the stored target (never a notify: an alert
        is not resent), so its annotations carry no figures."""
        repo = self._record
        try:
            if action is ActionKind.NOTIFY:
                if summary is None:
                    raise AssertionError("a notify step needs the job's summary")
                result = self._notify(policy, summary, target, reason, evidence, key, now)
                state = DONE if result.get("ok") else (SKIPPED if result.get("skipped") else FAILED)
                repo.finish_action(key, state, now, result=result, error=result.get("error"))
                return {"state": state, **result}
            if self.kube is None:
                repo.finish_action(key, SKIPPED, now, result={"why": "no Kubernetes access"})
                return {"state": SKIPPED, "why": "no Kubernetes access"}
            if action in self.config.disabled_actions:
                why = f"{action.value} is turned off in this installation (features)"
                repo.finish_action(key, SKIPPED, now, result={"why": why})
                return {"state": SKIPPED, "why": why}
            if action is ActionKind.ANNOTATE:
                result = self.kube.annotate(target, job_annotations(policy, target, summary, reason, now))
                repo.finish_action(key, DONE, now, result=result)
                return {"state": DONE, **result}
            if action is ActionKind.EVENT:
                note = event_note(policy, reason)
                result = self.kube.event(
                    target, key=key, reason="GpuPolicyViolation", note=note, action=f"policy/{policy.name}", now=now
                )
                repo.finish_action(key, DONE, now, result=result)
                return {"state": DONE, **result}
            if action is ActionKind.REQUEUE:
                return self._requeue(key, policy, target, reason, now)
        except AuditorError as exc:
            repo.finish_action(key, FAILED, now, error=str(exc))
            return {"state": FAILED, "error": str(exc)}
        raise AssertionError(action)  # pragma: no cover

    def _route(self, team: str | None) -> Route:
        return self.config.routes.get(team or "", self.config.default_route)

    def _notify(
        self,
        policy: Policy,
        summary: JobSummary,
        target: ActionTarget,
        reason: str,
        evidence: dict,
        key: str,
        now: datetime,
    ) -> dict:
        route = self._route(summary.team)
        if not route.slack_url and not route.webhook_url:
            return self._unrouted_alert(summary.team, policy)
        kw: dict[str, Any] = {"retry": self.config.retry}
        if self._sleep is not None:
            kw["sleep"] = self._sleep
        out: dict[str, Any] = {}
        lineage, ack_url = self._ack_link(summary, now)
        if route.slack_url:
            text, blocks = slack_message(policy, summary, reason, ack_url=ack_url, lineage=lineage)
            out["slack"] = SlackNotifier(route.slack_url, **kw).send(text, blocks).as_dict()
        if route.webhook_url:
            if not route.webhook_secret:
                out["webhook"] = {"ok": False, "error": "webhook has no signing secret"}
            else:
                payload = webhook_payload(policy, target, reason, evidence, key, now, lineage=lineage, ack_url=ack_url)
                import hashlib
                import uuid

                did = str(uuid.UUID(hashlib.sha256(key.encode()).hexdigest()[:32]))  # same id on a resume
                out["webhook"] = (
                    WebhookNotifier(route.webhook_url, route.webhook_secret, **kw)
                    .send("policy.violation", payload, delivery_id=did)
                    .as_dict()
                )
        out["ok"] = all(v.get("ok") for v in out.values() if isinstance(v, dict))
        errs = [str(v["error"]) for v in out.values() if isinstance(v, dict) and v.get("error")]
        if errs:
            out["error"] = "; ".join(errs)
        return out

    def _ack_link(self, summary: JobSummary, now: datetime) -> tuple[str, str | None]:
        """The job's lineage (``namespace/lineage``) and, with a link key configured, a fresh
        single-use link acknowledging it (sent to the job's team)."""
        key = lineage_of_summary(summary.to_json())
        if self.config.ack_links is None:
            return str(key), None
        import secrets

        to = f"team:{summary.team or key.namespace}"
        return str(key), self.config.ack_links.issue(key, to, now, secrets.token_hex(12))

    def _unrouted_alert(self, team: str, policy: Policy) -> dict:
        """The result of an alert that has nowhere to go: recorded as skipped (``reason``
        :data:`NO_DESTINATION`, the operator counts it), and a warning the first time per team,
        since every later alert of that team is lost the same way until a route is configured."""
        why = (
            f"no destination for team {team or '(none)'}: set notifications.routes.{team or '<team>'} "
            "or a default notifications.slack / notifications.webhook"
        )
        if team not in self._unrouted:
            self._unrouted.add(team)
            log.warning(
                "policy %s: alerts of team %s are not delivered (%s); they are recorded as skipped",
                policy.name,
                team or "(none)",
                why,
            )
        return {"ok": False, "skipped": True, "reason": NO_DESTINATION, "team": team, "why": why}

    def _requeue(self, key: str, policy: Policy, target: ActionTarget, reason: str, now: datetime) -> dict:
        repo = self._record
        assert self.kube is not None
        if policy.spec.mode is not Mode.ENFORCE:
            repo.finish_action(key, SKIPPED, now, result={"why": f"mode {policy.spec.mode.value} never requeues"})
            return {"state": SKIPPED, "why": f"mode {policy.spec.mode.value} never requeues"}
        why = self.config.requeue.allows(target.to_ref())
        job = JobKey(target.key.cluster, target.key.namespace, target.key.kind, target.key.name)
        if (
            why is None
            and repo.count_job_actions(job, "requeue", ("done", "waiting")) >= policy.spec.requeue.max_per_job
        ):
            why = "requeue cap per job reached"
        if why:
            repo.finish_action(key, SKIPPED, now, result={"why": why})
            return {"state": SKIPPED, "why": why}
        try:
            patch = self.kube.requeue_target(target)
        except RequeueRefused as exc:
            repo.finish_action(key, SKIPPED, now, result={"why": str(exc)})
            return {"state": SKIPPED, "why": str(exc)}
        result = self.kube.deactivate(patch, lower_priority_by=policy.spec.requeue.lower_priority_by)
        due = now + policy.spec.requeue.backoff
        result["reactivate_at"] = due.isoformat()
        result["backoff_s"] = policy.spec.requeue.backoff.total_seconds()
        if not result.get("reserved"):
            # nothing held (a plain Job, or a Workload without quota): the backoff starts now
            result["quota_released_at"] = now.isoformat()
        repo.finish_action(key, WAITING, now, result=result, due_at=due)
        self.kube.annotate(
            dataclasses.replace(target, pods=()),
            {
                "gpu-auditor.io/requeued-at": now.isoformat().replace("+00:00", "Z"),
                "gpu-auditor.io/requeue-reason": f"policy {policy.name}: {reason}",
                "gpu-auditor.io/reactivate-at": due.isoformat().replace("+00:00", "Z"),
            },
        )
        self.kube.event(
            target,
            key=key + "#stop",
            reason="GpuAuditorRequeue",
            action="requeue",
            now=now,
            note=f"gpu-auditor stopped this job to requeue it (policy {policy.name}: {reason}); "
            f"it goes back to its queue after {policy.spec.requeue.backoff}. It restarts from its last checkpoint.",
        )
        return {"state": WAITING, **result}
