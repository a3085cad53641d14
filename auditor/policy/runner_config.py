"""What the policy runner is configured with: alert routes, requeue limits, retries, features."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Mapping

from auditor.core.acklink import LinkIssuer
from auditor.notify.http import RetryPolicy
from auditor.policy.schema import ActionKind


@dataclass(frozen=True)
class Route:
    """Where a team's alerts go; any of the two may be unset."""

    slack_url: str | None = None
    webhook_url: str | None = None
    webhook_secret: str | None = None


@dataclass(frozen=True)
class RequeueSettings:
    """Requeue is off unless ``enabled`` and the job's namespace or queue is listed."""

    enabled: bool = False
    namespaces: frozenset[str] = frozenset()
    queues: frozenset[str] = frozenset()
    max_per_hour: int = 5  # cluster-wide

    def allows(self, summary: Mapping[str, Any]) -> str | None:
        """None when requeue is allowed for this job, else why not."""
        if not self.enabled:
            return "requeue is disabled (settings)"
        if summary.get("namespace") in self.namespaces or (
            summary.get("queue") and summary.get("queue") in self.queues
        ):
            return None
        return "requeue is not enabled for this namespace or queue"


@dataclass(frozen=True)
class RunnerConfig:
    cluster: str = "default"
    default_route: Route = Route()
    routes: Mapping[str, Route] = field(default_factory=dict)  # team → route
    requeue: RequeueSettings = RequeueSettings()
    retry: RetryPolicy = RetryPolicy()
    #: a claimed action not finished after this long was interrupted (crash): resume it
    stale_claim_after: timedelta = timedelta(minutes=10)
    instance: str = "gpu-auditor"
    #: action kinds turned off by the installation (the chart then grants no RBAC for them)
    disabled_actions: frozenset[ActionKind] = frozenset()
    #: the installation's ``mode: audit`` (a quiet start): every due step is decided as a dry run
    #: (``run_cycle(act=False)``: no ladder moves, the caller records would-do decisions), whatever
    #: the policy's own mode; no action runs, no queued alert is sent, no interrupted step is
    #: resumed (reactivating a job requeued earlier still is: it undoes our own write)
    audit_only: bool = False
    #: signed acknowledgement links for the alerts (settings gate.ack_link_*); None: alerts carry none
    ack_links: LinkIssuer | None = None
    #: alerts go to the persisted delivery queue (the operator: sent off the cycle by
    #: :class:`~auditor.policy.outbox.AlertOutbox`) instead of being sent within the cycle
    queue_alerts: bool = False
    #: at most this many alerts wait in the queue; a further one fails at once (and is retried later)
    queue_limit: int = 1000
    #: a queued alert is retried for this long, then recorded failed (and retried by the next step due)
    queue_deadline: timedelta = timedelta(hours=1)


def delivery_retry(timeout: timedelta, deadline: timedelta) -> RetryPolicy:
    """The notifiers' retry policy for ``notifications.timeout`` and ``notifications.deadline``."""
    return RetryPolicy(timeout=timeout.total_seconds(), deadline=deadline.total_seconds())
