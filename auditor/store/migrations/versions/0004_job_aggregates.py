"""Job aggregates: a job's folded statistics, so an operator cycle reads only its new buckets.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

``job_aggregates`` holds one row per job: the mergeable per-GPU statistics of every bucket that
starts before ``through`` (auditor.core.accumulate, serialized as JSON in ``state``). The operator
folds each cycle's finished buckets into it instead of re-reading the job's whole history. It is
derived data: the buckets stay the source of truth, a stale or unreadable row is rebuilt from
them, and writing buckets before ``through`` deletes the row.

``ix_gpu_buckets_job_start`` serves the bounded reads by job and time (policies' sustained
windows, the rebuild of a gap): the primary key starts with the job but orders by pod and GPU,
so without it such a read scans all of a job's buckets. Frozen once shipped, like 0001.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_aggregates",
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True, nullable=False),
        sa.Column("through", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_gpu_buckets_job_start", "gpu_buckets", ["job_id", "start"])


def downgrade() -> None:
    op.drop_index("ix_gpu_buckets_job_start", table_name="gpu_buckets")
    op.drop_table("job_aggregates")
