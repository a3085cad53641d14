"""Initial schema: jobs, the per-GPU bucket rollup, job summaries, audit runs.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Frozen: later changes come as new revisions (decisions and actions with their dedup keys are
planned as 0002), never as edits here. Types are spelled out rather than imported from the
package so that this file keeps meaning what it meant when it shipped.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)
_JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), primary_key=True, nullable=False),
        sa.Column("cluster", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("kind", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("uid", sa.String(64), nullable=True),
        sa.Column("team", sa.String(253), nullable=False, server_default=""),
        sa.Column("queue", sa.String(253), nullable=True),
        sa.Column("first_seen", _TS, nullable=False),
        sa.Column("last_seen", _TS, nullable=False),
        sa.Column("ended_at", _TS, nullable=True),
        sa.UniqueConstraint("cluster", "namespace", "kind", "name", name="uq_jobs_identity"),
    )
    op.create_index("ix_jobs_last_seen", "jobs", ["last_seen"])

    op.create_table(
        "gpu_buckets",
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("pod_namespace", sa.String(253), nullable=False),
        sa.Column("pod_name", sa.String(253), nullable=False),
        sa.Column("container", sa.String(253), nullable=False),
        sa.Column("gpu_uuid", sa.String(128), nullable=False),
        sa.Column("gpu_instance", sa.String(32), nullable=False),
        sa.Column("hostname", sa.String(253), nullable=False, server_default=""),
        sa.Column("gpu_index", sa.String(16), nullable=False, server_default=""),
        sa.Column("gpu_model", sa.String(128), nullable=False, server_default=""),
        sa.Column("mig_profile", sa.String(64), nullable=False, server_default=""),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("start", _TS, nullable=False),
        sa.Column("end", _TS, nullable=False),
        sa.Column("total", sa.Float(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("minimum", sa.Float(), nullable=True),
        sa.Column("maximum", sa.Float(), nullable=True),
        sa.Column("dropped", sa.Integer(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint(
            "job_id",
            "pod_namespace",
            "pod_name",
            "container",
            "gpu_uuid",
            "gpu_instance",
            "metric",
            "start",
            name="pk_gpu_buckets",
        ),
    )
    op.create_index("ix_gpu_buckets_end", "gpu_buckets", ["end"])

    op.create_table(
        "job_summaries",
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("cluster", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("team", sa.String(253), nullable=False, server_default=""),
        sa.Column("verdict", sa.String(64), nullable=False),
        sa.Column("start", _TS, nullable=True),
        sa.Column("end", _TS, nullable=True),
        sa.Column("gpu_hours", sa.Float(), nullable=True),
        sa.Column("waste_gpu_hours", sa.Float(), nullable=True),
        sa.Column("computed_at", _TS, nullable=False),
        sa.Column("data", _JSON, nullable=False),
    )
    op.create_index("ix_job_summaries_scope", "job_summaries", ["cluster", "namespace", "team"])
    op.create_index("ix_job_summaries_end", "job_summaries", ["end"])
    op.create_index("ix_job_summaries_verdict", "job_summaries", ["verdict"])

    op.create_table(
        "audit_runs",
        sa.Column("id", sa.Integer(), primary_key=True, nullable=False),
        sa.Column("window_start", _TS, nullable=False),
        sa.Column("window_end", _TS, nullable=False),
        sa.Column("started", _TS, nullable=False),
        sa.Column("finished", _TS, nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("queries", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("detail", _JSON, nullable=False),
    )
    op.create_index("ix_audit_runs_started", "audit_runs", ["started"])


def downgrade() -> None:
    op.drop_table("audit_runs")
    op.drop_table("job_summaries")
    op.drop_table("gpu_buckets")
    op.drop_table("jobs")
