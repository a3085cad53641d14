"""GPU-time ownership: which job identity each pod's buckets are stored under, per cluster.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

GPU time is owned once, by GPU and time, whatever job identity an audit gave it. Two audits of
one window into one store with different resolvers (``audit --kubeconfig``: the pod is part of
``Job/train``; ``audit --no-kube``: it is ``Pod/train-0``) wrote the same pod's buckets under two
jobs, and the weekly report counted their GPU-hours twice (16.1 instead of 8.05, over two teams).
A pod belongs to one job at a time, so the store keeps, per (cluster, pod), the jobs that hold
its buckets and the span of their bucket starts: a write finds another job holding the same
pod's GPU time in a few index reads, without an index on the buckets' pod columns (the largest
table; one more index there would slow every cycle's writes).

``gpu_pod_owners`` is derived from ``gpu_buckets`` and backfilled from it here (one scan of the
buckets, grouped by job and pod). A job's deletion cascades to its rows. Identities that already
hold the same GPU time in an existing store are not merged by this migration: the next audit of
that window decides (its write replaces the other's ownership, and says so). Frozen once
shipped, like 0001: types are spelled out, not imported from the package.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_pod_owners",
        sa.Column("cluster", sa.String(253), nullable=False),
        sa.Column("pod_namespace", sa.String(253), nullable=False),
        sa.Column("pod_name", sa.String(253), nullable=False),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("first_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_start", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "pod_namespace", "pod_name", "job_id", name="pk_gpu_pod_owners"),
    )
    op.execute(
        "INSERT INTO gpu_pod_owners (cluster, pod_namespace, pod_name, job_id, first_start, last_start) "
        "SELECT j.cluster, b.pod_namespace, b.pod_name, b.job_id, MIN(b.start), MAX(b.start) "
        "FROM gpu_buckets b JOIN jobs j ON j.id = b.job_id "
        "GROUP BY j.cluster, b.pod_namespace, b.pod_name, b.job_id"
    )


def downgrade() -> None:
    op.drop_table("gpu_pod_owners")
