"""The store's tables (sqlmodel) and the one column type that keeps times honest.

The schema itself is owned by the alembic migrations in ``migrations/versions``; these classes
describe the same tables for queries, and a test checks that the two never drift apart.
Writes of many rows go through ``Model.__table__`` with SQLAlchemy Core (executemany), not one
ORM object per row: one audit cycle writes ~100k bucket rows.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel


class UTCDateTime(sa.types.TypeDecorator):
    """A timestamp that is stored as UTC and always comes back timezone-aware in UTC.

    PostgreSQL keeps ``timestamptz`` but hands values back in the session's time zone; SQLite
    has no time type at all and SQLAlchemy drops the offset. Normalising on the way in (aware →
    UTC; naive values are refused, because guessing their zone silently shifts data) and on the
    way out makes both databases return identical, comparable values.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f"expected a datetime, got {type(value).__name__}: {value!r}")
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value.isoformat()} (times must be timezone-aware)")
        value = value.astimezone(timezone.utc)
        if dialect.name == "sqlite":
            # SQLite stores text; one fixed zone keeps string comparison equal to time order.
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


#: JSON everywhere, JSONB on PostgreSQL (indexable, compact).
JSONDoc = sa.JSON().with_variant(JSONB(), "postgresql")


class JobRow(SQLModel, table=True):
    """One job (a top-level owner of GPU pods), unique per cluster/namespace/kind/name."""

    __tablename__ = "jobs"
    __table_args__ = (sa.UniqueConstraint("cluster", "namespace", "kind", "name", name="uq_jobs_identity"),)

    id: Optional[int] = Field(default=None, primary_key=True)
    cluster: str = Field(sa_column=sa.Column(sa.String(253), nullable=False))
    namespace: str = Field(sa_column=sa.Column(sa.String(253), nullable=False))
    kind: str = Field(sa_column=sa.Column(sa.String(253), nullable=False))
    name: str = Field(sa_column=sa.Column(sa.String(253), nullable=False))
    uid: Optional[str] = Field(default=None, sa_column=sa.Column(sa.String(64), nullable=True))
    team: str = Field(default="", sa_column=sa.Column(sa.String(253), nullable=False, server_default=""))
    queue: Optional[str] = Field(default=None, sa_column=sa.Column(sa.String(253), nullable=True))
    first_seen: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))
    last_seen: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False, index=True))
    ended_at: Optional[datetime] = Field(default=None, sa_column=sa.Column(UTCDateTime(), nullable=True))


class BucketRow(SQLModel, table=True):
    """The rollup of one metric on one GPU for one pod over the half-open ``[start, end)``.

    This table is the store's source of truth; summaries and reports are derived from it.
    The bucket's identity is its primary key (no surrogate id: nothing points at a bucket, and
    at ~25M new rows a day at 1,000 jobs a 32-bit id sequence would run out within months).
    ``container`` and ``gpu_instance`` are '' when absent, so the key needs no NULL handling.
    ``minimum``/``maximum`` are NULL for a bucket without valid samples.
    """

    __tablename__ = "gpu_buckets"
    __table_args__ = (
        # (job, start) first (migration 0004): a cycle's new rows of a job are neighbours
        sa.PrimaryKeyConstraint(
            "job_id",
            "start",
            "pod_namespace",
            "pod_name",
            "container",
            "gpu_uuid",
            "gpu_instance",
            "metric",
            name="pk_gpu_buckets",
        ),
        sa.Index("ix_gpu_buckets_end", "end"),
    )

    job_id: int = Field(sa_column=sa.Column(sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False))
    pod_namespace: str = Field(sa_column=sa.Column(sa.String(253), nullable=False))
    pod_name: str = Field(sa_column=sa.Column(sa.String(253), nullable=False))
    container: str = Field(sa_column=sa.Column(sa.String(253), nullable=False))
    gpu_uuid: str = Field(sa_column=sa.Column(sa.String(128), nullable=False))
    gpu_instance: str = Field(sa_column=sa.Column(sa.String(32), nullable=False))
    hostname: str = Field(sa_column=sa.Column(sa.String(253), nullable=False, server_default=""))
    gpu_index: str = Field(sa_column=sa.Column(sa.String(16), nullable=False, server_default=""))
    gpu_model: str = Field(sa_column=sa.Column(sa.String(128), nullable=False, server_default=""))
    mig_profile: str = Field(sa_column=sa.Column(sa.String(64), nullable=False, server_default=""))
    metric: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    start: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))
    end: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))
    total: float = Field(sa_column=sa.Column(sa.Float, nullable=False))
    count: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    minimum: Optional[float] = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    maximum: Optional[float] = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    dropped: int = Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0"))


class SummaryRow(SQLModel, table=True):
    """The latest audit-JSON object of one job, plus the columns reports filter, sort and sum on.

    ``job`` … ``gr_engine_active_samples`` (migration 0005) and ``mfu_estimate`` …
    ``recoverable_gpu_hours`` (migration 0010) are copies of fields of ``data``
    (:func:`auditor.store.summaries.summary_columns`), so that the weekly report never parses the
    documents; NULL where the document lacks the field or holds another type there.
    ``ix_job_summaries_week`` covers the week's ``GROUP BY`` and ranking (no table row read).
    """

    __tablename__ = "job_summaries"
    __table_args__ = (
        sa.Index("ix_job_summaries_scope", "cluster", "namespace", "team"),
        sa.Index("ix_job_summaries_verdict", "verdict"),
        sa.Index(  # also serves every range on ``end`` (it replaced ix_job_summaries_end)
            "ix_job_summaries_week",
            "end",
            "start",
            "cluster",
            "team",
            "verdict",
            "gpu_model",
            "gpu_hours",
            "waste_gpu_hours",
            "tensor_active",
            "mfu_estimate",
            "recoverable_gpu_hours",
            "job_id",
        ),
    )

    job_id: int = Field(sa_column=sa.Column(sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True))
    cluster: str = Field(sa_column=sa.Column(sa.String(253), nullable=False))
    namespace: str = Field(sa_column=sa.Column(sa.String(253), nullable=False))
    team: str = Field(sa_column=sa.Column(sa.String(253), nullable=False, server_default=""))
    verdict: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    start: Optional[datetime] = Field(default=None, sa_column=sa.Column(UTCDateTime(), nullable=True))
    end: Optional[datetime] = Field(default=None, sa_column=sa.Column(UTCDateTime(), nullable=True))
    gpu_hours: Optional[float] = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    waste_gpu_hours: Optional[float] = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    computed_at: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))
    data: dict = Field(sa_column=sa.Column(JSONDoc, nullable=False))
    job: Optional[str] = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    gpu_model: Optional[str] = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    busy_signal: Optional[str] = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    sm_active: Optional[float] = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    tensor_active: Optional[float] = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    coverage: Optional[float] = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    gpu_util_samples: Optional[int] = Field(default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))
    gr_engine_active_samples: Optional[int] = Field(default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))
    # migration 0010 (issue 28): the MFU estimate, its reference and the source of that
    # reference (a workload class or ``lineage-best``), and the GPU-hours the MFU gap costs
    mfu_estimate: Optional[float] = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    mfu_reference: Optional[float] = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    mfu_class: Optional[str] = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    recoverable_gpu_hours: Optional[float] = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))


class AuditRunRow(SQLModel, table=True):
    """One audit (a CLI ``audit`` or one operator cycle): what window, how long, how it went."""

    __tablename__ = "audit_runs"
    __table_args__ = (sa.Index("ix_audit_runs_started", "started"),)

    id: Optional[int] = Field(default=None, primary_key=True)
    window_start: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))
    window_end: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))
    started: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))
    finished: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))
    jobs: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    queries: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    status: str = Field(sa_column=sa.Column(sa.String(32), nullable=False))
    detail: dict = Field(sa_column=sa.Column(JSONDoc, nullable=False))


class AggregateRow(SQLModel, table=True):
    """A job's folded statistics up to ``through`` (:class:`auditor.core.accumulate.JobAggregate`
    as JSON): derived from the buckets, rebuilt from them when stale or unreadable."""

    __tablename__ = "job_aggregates"

    job_id: int = Field(sa_column=sa.Column(sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True))
    through: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))
    updated: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))
    state: bytes = Field(sa_column=sa.Column(sa.LargeBinary, nullable=False))


class PodOwnerRow(SQLModel, table=True):
    """A job that holds buckets of a pod (migration 0006), with the span of their starts.

    Derived from ``gpu_buckets``: a pod belongs to one job at a time, so when a write of one job
    finds another holding the same pod's GPU time, the newer write takes it over (the store's
    ``replace_buckets``), and GPU-hours are never counted under two identities.
    """

    __tablename__ = "gpu_pod_owners"
    __table_args__ = (
        sa.PrimaryKeyConstraint("cluster", "pod_namespace", "pod_name", "job_id", name="pk_gpu_pod_owners"),
    )

    cluster: str = Field(sa_column=sa.Column(sa.String(253), nullable=False))
    pod_namespace: str = Field(sa_column=sa.Column(sa.String(253), nullable=False))
    pod_name: str = Field(sa_column=sa.Column(sa.String(253), nullable=False))
    job_id: int = Field(sa_column=sa.Column(sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False))
    first_start: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))
    last_start: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))


#: The tables this package owns (for schema comparison in tests and for retention).
TABLES: tuple[sa.Table, ...] = tuple(
    m.__table__  # type: ignore[union-attr]
    for m in (JobRow, BucketRow, SummaryRow, AuditRunRow, AggregateRow, PodOwnerRow)
)

# The Core tables behind the models, for bulk SQL (executemany, set-based deletes) without the
# ORM: one handle each, shared by the store, its retention and its report queries.
JOBS: sa.Table = JobRow.__table__  # type: ignore[attr-defined]
BUCKETS: sa.Table = BucketRow.__table__  # type: ignore[attr-defined]
SUMMARIES: sa.Table = SummaryRow.__table__  # type: ignore[attr-defined]
AUDIT_RUNS: sa.Table = AuditRunRow.__table__  # type: ignore[attr-defined]
AGGREGATES: sa.Table = AggregateRow.__table__  # type: ignore[attr-defined]
POD_OWNERS: sa.Table = PodOwnerRow.__table__  # type: ignore[attr-defined]
