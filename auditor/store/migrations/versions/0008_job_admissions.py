"""Kueue's admission facts per job: the ClusterQueue that admitted it, how long it waited, evictions.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

A team lead reading the weekly report asks first how long their jobs waited in the queue, next to
how well they used the GPUs once running. Kueue knows it (the job's Workload: its creation, the
``QuotaReserved``/``Admitted``/``Evicted``/``Requeued`` conditions, ``status.admission``,
``status.schedulingStats.evictions``, ``status.requeueState``), but only while the Workload
exists, and its conditions keep only their latest transition. One row per job keeps what the
operator read: the first admission (``admitted_at``, ``queue_wait_s``) is kept when Kueue
re-admits after an eviction, whose own wait is ``last_wait_s``. ``evictions`` holds Kueue's
counts by reason (``{reason: count}``), ``eviction_count`` their sum. A job's deletion cascades
to its row. Frozen once shipped, like 0001: types are spelled out, not imported from the package.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)
_JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "job_admissions",
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("workload_name", sa.String(253), nullable=False),
        sa.Column("workload_uid", sa.String(64), nullable=True),
        sa.Column("cluster_queue", sa.String(253), nullable=True),
        sa.Column("local_queue", sa.String(253), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("quota_reserved_at", _TS, nullable=True),
        sa.Column("admitted_at", _TS, nullable=True),
        sa.Column("queue_wait_s", sa.Float(), nullable=True),
        sa.Column("last_admitted_at", _TS, nullable=True),
        sa.Column("last_wait_s", sa.Float(), nullable=True),
        sa.Column("eviction_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("evictions", _JSON, nullable=False),
        sa.Column("requeue_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("last_eviction_reason", sa.String(316), nullable=True),
        sa.Column("last_evicted_at", _TS, nullable=True),
        sa.Column("pending", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("updated_at", _TS, nullable=False),
    )
    op.create_index("ix_job_admissions_admitted", "job_admissions", ["admitted_at"])


def downgrade() -> None:
    op.drop_index("ix_job_admissions_admitted", table_name="job_admissions")
    op.drop_table("job_admissions")
