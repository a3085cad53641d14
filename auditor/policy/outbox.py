"""The operator's alert delivery queue: alerts are sent off the cycle, so a slow or hung receiver
never delays an audit.

A policy step that notifies records its alert ``queued`` in the escalation record (the action's
row holds the rendered message per channel and ``due_at``, its next try: the queue is persisted
and survives a restart). :meth:`AlertOutbox.drain`, run by the operator's delivery job between
and beside cycles, takes each due alert (compare-and-set, so two replicas never send one alert
twice), makes one try per channel and records the outcome:

- delivered → ``done``; a channel that got no answer from a receiver without an idempotency key
  (Slack) is *unconfirmed*, never resent;
- a retryable failure (network, timeout, 5xx, 429) → ``queued`` again, ``due_at`` after the
  receiver's Retry-After or a backoff, until the alert's deadline (``queue_deadline``) → ``failed``;
- any other 4xx → ``failed`` at once.

A receiver that timed out is not tried again in the same pass: one hung receiver costs one
timeout per pass, not one per alert, and the other receivers' alerts go on. The pass itself
stops taking alerts after ``budget`` seconds. A failed alert is sent again by the runner before
the violation's next step (see :meth:`auditor.policy.runner.PolicyRunner`), never by the queue.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable

from auditor.core.violations import CLAIMED, QUEUED
from auditor.policy.dispatch import CHANNELS, notify_state, send_alert, summarize_channels
from auditor.policy.record import EscalationRecord
from auditor.policy.runner_config import RunnerConfig

log = logging.getLogger("auditor.policy.runner")


@dataclass
class DrainResult:
    """What one pass of the queue did, by the alerts' dedup keys."""

    sent: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    retrying: list[str] = field(default_factory=list)
    #: due but not tried in this pass (its time budget was spent)
    left: int = 0

    @property
    def tried(self) -> int:
        return len(self.sent) + len(self.failed) + len(self.retrying)


class AlertOutbox:
    """Sends the queued alerts of ``config.cluster`` through the routes of ``config``."""

    def __init__(
        self,
        record: EscalationRecord,
        config: RunnerConfig,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._record = record
        self.config = config
        self._monotonic = monotonic

    def waiting(self) -> list[Any]:
        """The queued alerts, due or not, oldest first."""
        rows = self._record.actions_in([QUEUED], cluster=self.config.cluster, action="notify")
        return sorted(rows, key=lambda r: (r.due_at or r.updated_at, r.id))

    def drain(self, now: datetime, *, budget: float = 30.0) -> DrainResult:
        """One pass: try every alert due at ``now`` once, for at most ``budget`` seconds (none in
        the installation's audit mode: alerts queued before it wait, nothing is sent to users)."""
        if self.config.audit_only:
            return DrainResult()
        began = self._monotonic()
        out = DrainResult()
        slow: set[str] = set()  # receivers that did not answer in this pass
        for row in self.waiting():
            if row.due_at is not None and row.due_at > now:
                continue
            if self._monotonic() - began >= budget:
                out.left += 1
                continue
            if not self._record.take_action(row.dedup_key, QUEUED, CLAIMED, now):
                continue  # another replica is sending it
            result, due = self._try(dict(row.result), now, slow)
            state = notify_state(result)
            self._record.finish_action(
                row.dedup_key, state, now, result=result, error=result.get("error"), due_at=due if due else None
            )
            if state == QUEUED:
                out.retrying.append(row.dedup_key)
            elif result.get("ok"):
                out.sent.append(row.dedup_key)
            else:
                out.failed.append(row.dedup_key)
                log.warning("alert %s not delivered: %s", row.dedup_key, result.get("error"))
        return out

    def _try(self, result: dict, now: datetime, slow: set[str]) -> tuple[dict, datetime | None]:
        """One try per pending channel of one alert; returns its new result and next try time."""
        route = self.config.routes.get(result.get("team") or "", self.config.default_route)
        one_try = dataclasses.replace(self.config.retry, attempts=1)
        next_at: list[datetime] = []
        for channel in CHANNELS:
            entry = result.get(channel)
            if not isinstance(entry, dict) or not entry.get("pending"):
                continue
            entry = dict(entry)
            result[channel] = entry
            url = (route.slack_url if channel == "slack" else route.webhook_url) or ""
            if url in slow:
                next_at.append(now)
                continue
            d = send_alert(route, channel, entry["message"], retry=one_try)
            entry.update(
                attempts=int(entry.get("attempts") or 0) + 1,
                status=d.status,
                error=d.error,
                delivery_id=d.delivery_id or entry.get("delivery_id", ""),
                unconfirmed=d.unconfirmed,
                ok=d.ok,
            )
            if d.status is None and not d.ok:
                slow.add(url)
            deadline = datetime.fromisoformat(entry["deadline"])
            wait = d.retry_after if d.retry_after is not None else self.config.retry.backoff(entry["attempts"])
            if d.retryable and now + timedelta(seconds=wait) < deadline:
                next_at.append(now + timedelta(seconds=wait))
                continue
            if d.retryable:
                entry["error"] = f"{d.error} (gave up after {entry['attempts']} attempt(s) by its deadline {deadline})"
            entry.pop("pending", None)
            entry.pop("message", None)
        return summarize_channels(result), (min(next_at) if next_at else None)
