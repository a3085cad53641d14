"""Weekly reports in the operator loop: the cron job, and a check after every cycle.

Sending is safe to repeat (the store's delivery ledger sends each team's report once per week,
across restarts and replicas), so the leader simply asks "is anything due?" on the schedule and
after each cycle; a standby never sends.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Callable

from auditor.errors import AuditorError
from auditor.settings import Settings

log = logging.getLogger(__name__)


class ReportStage:
    """Built at start-up, so a bad schedule, time zone or price stops the operator with a clear error."""

    def __init__(self, settings: Settings, store: Any, destinations: Any = None) -> None:
        from auditor.reports import Destinations, build_trigger, options_from

        self.store = store
        #: an empty ``reports.weekly_schedule`` turns the weekly reports off
        self.enabled = bool(settings.reports.weekly_schedule.strip())
        self.options = options_from(settings.reports, cluster=settings.cluster)
        self.trigger = build_trigger(settings.reports.weekly_schedule, self.options.timezone) if self.enabled else None
        #: the Slack channels and webhook (the operator's come from the composition root)
        self.destinations = destinations or Destinations.from_settings(settings.notifications)

    def schedule(self, scheduler: Any, is_leader: Callable[[], bool], clock: Callable[[], datetime]) -> None:
        """Register the cron job; it sends what is due at ``clock()`` (the operator's clock)."""
        from auditor.reports import add_report_job

        if self.enabled:
            add_report_job(scheduler, self.trigger, lambda: self.send(clock()) if is_leader() else None)

    def send(self, now: datetime) -> None:
        """Send what is due at ``now`` (the operator's clock); a failure is logged (the ledger
        retries it later), never raised."""
        from auditor.reports import send_due_reports

        if not self.enabled:
            return
        try:
            result = send_due_reports(
                self.store,
                now,
                trigger=self.trigger,
                destinations=self.destinations,
                options=self.options,
            )
        except AuditorError as exc:
            log.error("weekly reports: %s", exc)
            return
        if result.sent or result.failed:
            log.info("weekly reports for %s: %d sent, %d failed", result.week, len(result.sent), len(result.failed))
