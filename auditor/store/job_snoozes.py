"""Job snoozes on a :class:`~auditor.store.Store` (migration 0011): paused escalation ladders.

The policy runner reads the snoozes in force once per cycle (one indexed read by cluster and
end); the signed link, the console and the CLI write them. Kept apart from the gate's
acknowledgements (:mod:`auditor.store.lineage`): those are by lineage and say what the gate
does with the next submission; these are by job and say what the ladder does with this one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from auditor.core.identity import JobKey
from auditor.core.job_snooze import JobSnooze, in_force
from auditor.errors import BadInput, StoreError
from auditor.store.lineage import LinkAlreadyUsed
from auditor.store.store import Store
from auditor.store.tables import UTCDateTime

_md = sa.MetaData()

job_snoozes = sa.Table(
    "job_snoozes",
    _md,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("cluster", sa.String(253), nullable=False),
    sa.Column("namespace", sa.String(253), nullable=False),
    sa.Column("kind", sa.String(253), nullable=False),
    sa.Column("name", sa.String(253), nullable=False),
    sa.Column("by", sa.String(253), nullable=False),
    sa.Column("at", UTCDateTime, nullable=False),
    sa.Column("until", UTCDateTime, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("via", sa.String(32), nullable=False),
    sa.Column("link_id", sa.String(128), nullable=True, unique=True),
    sa.Index("ix_job_snoozes_until", "cluster", "until"),
    sa.Index("ix_job_snoozes_job", "cluster", "namespace", "name", "kind"),
)

#: the tables of this module (schema comparison in tests)
TABLES: tuple[sa.Table, ...] = (job_snoozes,)


class JobSnoozeLog:
    """Snoozes of running jobs' escalation ladders: who, when, until when, why, through what."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def snooze(
        self,
        job: JobKey,
        by: str,
        until: datetime,
        reason: str,
        now: datetime,
        *,
        via: str = "cli",
        link_id: str | None = None,
    ) -> JobSnooze:
        """Record that ``by`` paused ``job``'s ladder at ``now`` until ``until``.

        ``link_id`` (a signed link's id) may be used once: a second use raises
        :class:`~auditor.store.lineage.LinkAlreadyUsed` and records nothing.
        """
        if not by.strip():
            raise BadInput("a snooze needs who made it (by)")
        if until <= now:
            raise BadInput(f"until {until.isoformat()} is not after now ({now.isoformat()})")
        s = JobSnooze(job=job, by=by.strip(), at=now, until=until, reason=reason.strip(), via=via)
        try:
            with self.store.writing(f"snooze the escalation of {job}") as conn:
                conn.execute(
                    job_snoozes.insert().values(
                        **job.columns(), by=s.by, at=s.at, until=s.until, reason=s.reason, via=s.via, link_id=link_id
                    )
                )
        except StoreError as exc:
            if link_id is not None and self.link_used(link_id):
                raise LinkAlreadyUsed(f"this snooze link was already used ({link_id})") from exc
            raise
        return s

    def link_used(self, link_id: str) -> bool:
        with self.store.reading("look up a snooze link") as conn:
            found = conn.execute(sa.select(job_snoozes.c.id).where(job_snoozes.c.link_id == link_id)).first()
        return found is not None

    def in_force(self, now: datetime, *, cluster: str | None = None) -> dict[JobKey, JobSnooze]:
        """By job, the snooze in force at ``now`` that lasts longest (the runner, once a cycle)."""
        q = sa.select(job_snoozes).where(job_snoozes.c.until > now, job_snoozes.c.at <= now)
        if cluster is not None:
            q = q.where(job_snoozes.c.cluster == cluster)
        with self.store.reading("read the snoozed jobs") as conn:
            return in_force((_snooze(r) for r in conn.execute(q)), now)

    def of_job(self, job: JobKey) -> list[JobSnooze]:
        """Every snooze of ``job``, oldest first (``explain``, the console's job page)."""
        c = job_snoozes.c
        q = (
            sa.select(job_snoozes)
            .where(c.cluster == job.cluster, c.namespace == job.namespace, c.kind == job.kind, c.name == job.name)
            .order_by(c.at, c.id)
        )
        with self.store.reading(f"read the snoozes of {job}") as conn:
            return [_snooze(r) for r in conn.execute(q)]


def _snooze(r: Any) -> JobSnooze:
    return JobSnooze(
        job=JobKey(r.cluster, r.namespace, r.kind, r.name),
        by=r.by,
        at=r.at,
        until=r.until,
        reason=r.reason or "",
        via=r.via or "cli",
    )
