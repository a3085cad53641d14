"""The table of Kueue's admission facts per job (migration 0008), declared for queries.

Its own module, not ``tables.py``: it belongs to the admission facts (``admissions.py`` reads
and writes it), and a test keeps it equal to the migration like the store's other tables.
"""

from __future__ import annotations

from datetime import datetime
from typing import Optional

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from auditor.store.tables import JSONDoc, UTCDateTime


class AdmissionRow(SQLModel, table=True):
    """What Kueue's Workload said about one job's admission, as the operator last read it.

    ``admitted_at``/``queue_wait_s`` are the first admission and the wait before it (kept when
    Kueue re-admits after an eviction); ``last_admitted_at``/``last_wait_s`` the latest one.
    ``evictions`` maps Kueue's eviction reason to its count; ``eviction_count`` is their sum.
    ``pending`` is true while the Workload waits for (re-)admission.
    """

    __tablename__ = "job_admissions"
    __table_args__ = (sa.Index("ix_job_admissions_admitted", "admitted_at"),)

    job_id: int = Field(sa_column=sa.Column(sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True))
    workload_name: str = Field(sa_column=sa.Column(sa.String(253), nullable=False))
    workload_uid: Optional[str] = Field(default=None, sa_column=sa.Column(sa.String(64), nullable=True))
    cluster_queue: Optional[str] = Field(default=None, sa_column=sa.Column(sa.String(253), nullable=True))
    local_queue: Optional[str] = Field(default=None, sa_column=sa.Column(sa.String(253), nullable=True))
    created_at: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))
    quota_reserved_at: Optional[datetime] = Field(default=None, sa_column=sa.Column(UTCDateTime(), nullable=True))
    admitted_at: Optional[datetime] = Field(default=None, sa_column=sa.Column(UTCDateTime(), nullable=True))
    queue_wait_s: Optional[float] = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    last_admitted_at: Optional[datetime] = Field(default=None, sa_column=sa.Column(UTCDateTime(), nullable=True))
    last_wait_s: Optional[float] = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    eviction_count: int = Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0"))
    evictions: dict = Field(sa_column=sa.Column(JSONDoc, nullable=False))
    requeue_count: int = Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False, server_default="0"))
    last_eviction_reason: Optional[str] = Field(default=None, sa_column=sa.Column(sa.String(316), nullable=True))
    last_evicted_at: Optional[datetime] = Field(default=None, sa_column=sa.Column(UTCDateTime(), nullable=True))
    pending: bool = Field(default=False, sa_column=sa.Column(sa.Boolean, nullable=False, server_default=sa.false()))
    updated_at: datetime = Field(sa_column=sa.Column(UTCDateTime(), nullable=False))


ADMISSIONS: sa.Table = AdmissionRow.__table__  # type: ignore[attr-defined]
