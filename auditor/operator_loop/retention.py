"""Store retention in the operator loop: an hourly apscheduler job, for this cluster only.

Retention is a store-side rule (:mod:`auditor.store.retention`); the operator only runs it on
a schedule, as the leader, between cycles (never while one writes), for the cluster it audits:
several clusters may share one store, each with its own retention settings.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any, Callable

from auditor.errors import AuditorError
from auditor.settings import Settings
from auditor.store.retention import PruneResult, Retention, prune

log = logging.getLogger(__name__)

#: how often the operator prunes; an hour's worth of aged-out rows is a small delete
EVERY = timedelta(hours=1)
#: the first prune after start: soon (an operator restarted more often than hourly still
#: prunes), but after the first cycle has had its turn
FIRST_AFTER = timedelta(minutes=2)
JOB_ID = "retention"


class RetentionStage:
    """Built at start-up from ``store.retention`` (validated by the settings) and ``cluster``."""

    def __init__(self, settings: Settings, store: Any) -> None:
        self.store = store
        self.cluster = settings.cluster
        self.retention = Retention.from_settings(settings)

    def schedule(self, scheduler: Any, job: Callable[[], Any], *, start: datetime) -> None:
        """Register ``job`` (the operator's guarded :meth:`run`) to run every :data:`EVERY`
        from ``start + FIRST_AFTER`` on."""
        scheduler.add_job(
            job,
            "interval",
            seconds=EVERY.total_seconds(),
            id=JOB_ID,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
            next_run_time=start + FIRST_AFTER,
        )

    def run(self, now: datetime) -> PruneResult | None:
        """Prune this cluster's aged-out rows; a failure is logged (the next hour retries), never raised."""
        try:
            result = prune(self.store, now, self.retention, cluster=self.cluster)
        except AuditorError as exc:
            log.error("store retention for cluster %s: %s", self.cluster, exc)
            return None
        if result.total:
            log.info(
                "store retention for cluster %s: deleted %s",
                self.cluster,
                ", ".join(f"{n} {t}" for t, n in result.deleted.items() if n),
            )
        return result
