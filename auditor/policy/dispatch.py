"""Carrying out a claimed policy step: each action (notify, annotate, event, requeue) runs here
and its outcome is recorded on the action's row, so a crash between the two is found by the
runner's recovery (:mod:`auditor.policy.recovery`)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import uuid
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

from auditor.core.action_target import ActionTarget
from auditor.core.identity import JobKey
from auditor.core.job_summary import JobSummary
from auditor.core.lineage import lineage_of_summary
from auditor.core.violations import DONE, FAILED, QUEUED, SKIPPED, WAITING
from auditor.errors import AuditorError, RequeueRefused
from auditor.notify import Delivery, RetryPolicy, SlackNotifier, WebhookNotifier
from auditor.policy.alerts import AlertLinks, event_note, job_annotations, slack_message, webhook_payload
from auditor.policy.record import EscalationRecord
from auditor.policy.runner_config import Route, RunnerConfig
from auditor.policy.schema import ActionKind, Mode, Policy

if TYPE_CHECKING:
    from auditor.ports import CheckRequeue, ClusterActions

log = logging.getLogger("auditor.policy.runner")

#: ``reason`` of a notification recorded as skipped because its team has no destination
NO_DESTINATION = "no_destination"


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: the channels an alert goes to, as keys of its result
CHANNELS = ("slack", "webhook")


def delivery_id(key: str) -> str:
    """A stable UUID from the action's dedup key: the same alert carries the same id on every
    try and resend, so a webhook receiver can drop the copies."""
    return str(uuid.UUID(hashlib.sha256(key.encode()).hexdigest()[:32]))


def send_alert(
    route: Route,
    channel: str,
    message: dict,
    *,
    retry: RetryPolicy,
    sleep: Callable[[float], None] | None = None,
) -> Delivery:
    """Send one rendered alert (a ``message`` of :meth:`StepActions._notify`) to one channel."""
    kw: dict[str, Any] = {"retry": retry}
    if sleep is not None:
        kw["sleep"] = sleep
    if channel == "slack" and route.slack_url:
        return SlackNotifier(route.slack_url, **kw).send(message["text"], message.get("blocks"))
    if channel == "webhook" and route.webhook_url:
        if not route.webhook_secret:
            return Delivery(False, None, 0, error="webhook has no signing secret")
        return WebhookNotifier(route.webhook_url, route.webhook_secret, **kw).send(
            message["kind"], message["payload"], delivery_id=message["delivery_id"]
        )
    return Delivery(False, None, 0, error=f"no {channel} destination for this team any more")


def summarize_channels(out: dict) -> dict:
    """``ok``, ``pending`` and ``error`` of an alert's result from its channels' entries."""
    entries = [out[c] for c in CHANNELS if isinstance(out.get(c), dict)]
    out["ok"] = bool(entries) and all(e.get("ok") for e in entries)
    out["pending"] = any(e.get("pending") for e in entries)
    errs = [f"{c}: {out[c]['error']}" for c in CHANNELS if isinstance(out.get(c), dict) and out[c].get("error")]
    out.pop("error", None)
    if errs:
        out["error"] = "; ".join(errs)
    return out


def notify_state(result: dict) -> str:
    """The action state of an alert's result: done, queued (a channel still to send), skipped
    (no destination) or failed."""
    if result.get("skipped"):
        return SKIPPED
    if result.get("pending"):
        return QUEUED
    return DONE if result.get("ok") else FAILED


def maybe_delivered(result: dict) -> bool:
    """True when a failed alert may have arrived all the same (a channel sent it but got no
    answer, or the process died while sending): it is not sent again."""
    return bool(result.get("maybe_delivered")) or any(
        isinstance(result.get(c), dict) and result[c].get("unconfirmed") for c in CHANNELS
    )


class StepActions:
    """The side effects of policy steps, each recorded on its action row in ``record``."""

    def __init__(
        self,
        record: EscalationRecord,
        kube: "ClusterActions | None",
        config: RunnerConfig,
        sleep: Callable[[float], None] | None = None,
        check_requeue: "CheckRequeue | None" = None,
    ) -> None:
        self._record = record
        self.kube = kube
        self.config = config
        self._sleep = sleep
        #: the requeue through the efficiency gate's AdmissionCheck (None: always ``spec.active``)
        self.check_requeue = check_requeue
        #: teams already warned about having no alert destination (once per team and process)
        self._unrouted: set[str] = set()
        #: receivers that gave no answer in this cycle: not tried again until the next one, so one
        #: hung receiver costs one deadline per cycle, not one per alert
        self._unanswering: set[str] = set()

    def new_cycle(self) -> None:
        """Forget the receivers that gave no answer (each cycle tries them again)."""
        self._unanswering.clear()

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
        before: dict | None = None,
    ) -> dict:
        """Carry out ``action`` on ``target`` and record its outcome. ``summary`` is the job's
        summary in a cycle; a resumed step has only the stored target (never a notify: an alert
        is not resent), so its annotations carry no figures. ``before``: the stored result of
        an alert sent again (its channels that delivered, or may have, are not sent twice)."""
        repo = self._record
        try:
            if action is ActionKind.NOTIFY:
                if summary is None:
                    raise AssertionError("a notify step needs the job's summary")
                result = self._notify(policy, summary, target, reason, evidence, key, now, before=before)
                state = notify_state(result)
                due = now if state == QUEUED else None
                repo.finish_action(key, state, now, result=result, error=result.get("error"), due_at=due)
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
        *,
        before: dict | None = None,
    ) -> dict:
        """Send the alert to the team's channels (or queue it, ``config.queue_alerts``); a
        channel that delivered before, or may have, is kept as it was."""
        route = self._route(summary.team)
        if not route.slack_url and not route.webhook_url:
            return self._unrouted_alert(summary.team, policy)
        prev = before or {}
        lineage, links = self._links(summary, now)
        messages: dict[str, dict] = {}
        if route.slack_url:
            text, blocks = slack_message(policy, summary, reason, links=links)
            messages["slack"] = {"text": text, "blocks": blocks}
        if route.webhook_url:
            payload = webhook_payload(policy, target, reason, evidence, key, now, lineage=lineage, links=links)
            messages["webhook"] = {"kind": "policy.violation", "payload": payload, "delivery_id": delivery_id(key)}
        out: dict[str, Any] = {"team": summary.team}
        for channel, message in messages.items():
            earlier = prev.get(channel)
            if isinstance(earlier, dict) and (earlier.get("ok") or earlier.get("unconfirmed")):
                out[channel] = earlier
            elif self.config.queue_alerts:
                out[channel] = {
                    "ok": False,
                    "pending": True,
                    "attempts": int((earlier or {}).get("attempts") or 0),
                    "delivery_id": message.get("delivery_id", ""),
                    "error": None,
                    "message": message,
                    "deadline": (now + self.config.queue_deadline).isoformat(),
                }
            else:
                out[channel] = self._send_now(route, channel, message).as_dict()
        if self.config.queue_alerts and self._queue_full(now):
            for channel, entry in out.items():
                if isinstance(entry, dict) and entry.get("pending"):
                    out[channel] = {
                        "ok": False,
                        "attempts": entry["attempts"],
                        "error": f"the delivery queue is full ({self.config.queue_limit} alerts waiting)",
                    }
        return summarize_channels(out)

    def _send_now(self, route: Route, channel: str, message: dict) -> Delivery:
        url = (route.slack_url if channel == "slack" else route.webhook_url) or ""
        if url in self._unanswering:
            return Delivery(False, None, 0, error="not sent: this receiver gave no answer earlier in this cycle")
        d = send_alert(route, channel, message, retry=self.config.retry, sleep=self._sleep)
        if d.status is None and not d.ok and d.attempts:
            self._unanswering.add(url)
        return d

    def _queue_full(self, now: datetime) -> bool:
        waiting = self._record.count_actions("notify", since=_EPOCH, states=(QUEUED,), cluster=self.config.cluster)
        return waiting >= self.config.queue_limit

    def _links(self, summary: JobSummary, now: datetime) -> tuple[str, AlertLinks | None]:
        """The job's lineage (``namespace/lineage``) and, with a link key configured, two fresh
        single-use links sent to the job's team: one snoozing the job's escalation, one
        acknowledging its lineage for the gate (each with its own nonce)."""
        key = lineage_of_summary(summary.to_json())
        issuer = self.config.ack_links
        if issuer is None:
            return str(key), None
        import secrets

        to = f"team:{summary.team or key.namespace}"
        return str(key), AlertLinks(
            lineage=str(key),
            ack_url=issuer.issue(key, to, now, secrets.token_hex(12)),
            snooze_url=issuer.issue_snooze(summary.key, to, now, secrets.token_hex(12)),
            snooze_for=issuer.snooze,
        )

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
        not_via_check = None
        if self.check_requeue is not None and patch["type"] == "workload" and patch.get("reserved"):
            try:
                via = self.check_requeue.requeue(
                    patch,
                    f"gpu-auditor: requeued by policy {policy.name}: {reason}",
                    backoff_s=round(policy.spec.requeue.backoff.total_seconds()),
                    lower_priority_by=policy.spec.requeue.lower_priority_by,
                    now=now,
                )
            except AuditorError as exc:  # the job is requeued all the same, the other way
                log.warning("requeue of %s through the admission check failed (%s); using spec.active", target.key, exc)
                via = {"used": False, "why": f"the admission check's Retry failed: {exc}"}
            if via.pop("used", False):
                return self._requeued_through_check(key, policy, target, reason, now, {**patch, **via})
            not_via_check = via.get("why")
        result = self.kube.deactivate(patch, lower_priority_by=policy.spec.requeue.lower_priority_by)
        result["path"] = "spec.active"
        if not_via_check:
            result["admission_check_not_used"] = not_via_check
        due = now + policy.spec.requeue.backoff
        result["reactivate_at"] = due.isoformat()
        result["backoff_s"] = policy.spec.requeue.backoff.total_seconds()
        if not result.get("reserved"):
            # nothing held (a plain Job, or a Workload without quota): the backoff starts now
            result["quota_released_at"] = now.isoformat()
        repo.finish_action(key, WAITING, now, result=result, due_at=due)
        self._tell_requeued(
            target,
            key,
            now,
            {"gpu-auditor.io/reactivate-at": due.isoformat().replace("+00:00", "Z")},
            f"gpu-auditor stopped this job to requeue it (policy {policy.name}: {reason}); "
            f"it goes back to its queue after {policy.spec.requeue.backoff}.",
            f"policy {policy.name}: {reason}",
        )
        return {"state": WAITING, **result}

    def _tell_requeued(
        self, target: ActionTarget, key: str, now: datetime, annotations: dict, note: str, why: str
    ) -> None:
        """The requeued job's annotations (when, why, and what the path adds) and its Event."""
        assert self.kube is not None
        self.kube.annotate(
            dataclasses.replace(target, pods=()),
            {
                "gpu-auditor.io/requeued-at": now.isoformat().replace("+00:00", "Z"),
                "gpu-auditor.io/requeue-reason": why,
                **annotations,
            },
        )
        self.kube.event(
            target,
            key=key + "#stop",
            reason="GpuAuditorRequeue",
            action="requeue",
            now=now,
            note=f"{note} It restarts from its last checkpoint.",
        )

    def _requeued_through_check(
        self, key: str, policy: Policy, target: ActionTarget, reason: str, now: datetime, result: dict
    ) -> dict:
        """Record and tell a requeue made through the gate's check: done (Kueue brings the job back
        after the backoff; there is nothing to reactivate), the path said in the row, the job's
        annotations and the Event."""
        backoff = policy.spec.requeue.backoff
        due = now + backoff
        result.update(
            type="workload",
            path="admission-check",
            backoff_s=backoff.total_seconds(),
            requeued_at=now.isoformat(),
            back_in_queue_at=due.isoformat(),
        )
        self._record.finish_action(key, DONE, now, result=result)
        self._tell_requeued(
            target,
            key,
            now,
            {"gpu-auditor.io/requeue-path": f"admission check {', '.join(result.get('checks') or [])}"},
            f"gpu-auditor requeued this job through its admission check (policy {policy.name}: {reason}): "
            f"Kueue evicts it and queues it again after {backoff}, behind the {result.get('pending_workloads')} "
            f"Workload(s) waiting in ClusterQueue {result.get('cluster_queue')}.",
            f"policy {policy.name}: {reason}",
        )
        return {"state": DONE, **result}
