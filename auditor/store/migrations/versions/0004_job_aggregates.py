"""Job aggregates: a job's folded statistics, so an operator cycle reads only its new buckets.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

``job_aggregates`` holds one row per job: the mergeable per-GPU statistics of every bucket that
starts before ``through`` (auditor.core.accumulate, serialized as JSON in ``state``). The operator
folds each cycle's finished buckets into it instead of re-reading the job's whole history. It is
derived data: the buckets stay the source of truth, a stale or unreadable row is rebuilt from
them, and writing buckets before ``through`` deletes the row.

The primary key of ``gpu_buckets`` becomes ``(job_id, start, pod…, gpu…, metric)`` (was
``(job_id, pod…, gpu…, metric, start)``): the same columns, so the same uniqueness, in an order
where one cycle's new buckets of a job are neighbours at the end of the job's range. In the old
order each (pod, GPU, metric) run got its row in its own place, and with a day of history that
is a separate index page per run (up to 18,000 for a cycle of 2,000 GPUs × 9 metrics): on SQLite
the cycle's writes and commit grew with the jobs' age. The new order also serves the bounded reads by job and time
(policies' sustained windows, the rebuild of a gap) without another index. SQLite rebuilds the
table for it (alembic's batch mode: copy, drop, rename), once. Frozen once shipped, like 0001.
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
        sa.Column(
            "job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True, nullable=False
        ),
        sa.Column("through", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=False),
    )
    _primary_key(_NEW_KEY)


def downgrade() -> None:
    _primary_key(_OLD_KEY)
    op.drop_table("job_aggregates")


_OLD_KEY = ["job_id", "pod_namespace", "pod_name", "container", "gpu_uuid", "gpu_instance", "metric", "start"]
_NEW_KEY = ["job_id", "start", "pod_namespace", "pod_name", "container", "gpu_uuid", "gpu_instance", "metric"]


def _primary_key(columns: list[str]) -> None:
    if op.get_bind().dialect.name == "sqlite":
        with op.batch_alter_table("gpu_buckets", recreate="always") as batch:
            batch.drop_constraint("pk_gpu_buckets", type_="primary")
            batch.create_primary_key("pk_gpu_buckets", columns)
    else:
        op.drop_constraint("pk_gpu_buckets", "gpu_buckets", type_="primary")
        op.create_primary_key("pk_gpu_buckets", "gpu_buckets", columns)
