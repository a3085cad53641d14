"""Lineages for the efficiency gate: each lineage's runs, acknowledgements and snoozes.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

The gate decides a re-submission on the history of its lineage ("the same job again": the label
``gpu-auditor.io/lineage``, else the top owner's name without a generated suffix), per
(cluster, namespace, lineage). ``lineage_runs`` keeps each job's latest verdict and finding codes
by the job's identity (kind, name, uid; '' when unknown), not by ``jobs.id``: the history outlives
the retention of the buckets it was judged on. ``lineage_acks`` records who acknowledged or
snoozed a lineage, when, until when, why and through what (cli, link, annotation); a signed
link's id is unique, so a link acknowledges once. Frozen once shipped, like 0001: types are
spelled out, not imported from the package.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)
_JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "lineages",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("cluster", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("lineage", sa.String(253), nullable=False),
        sa.Column("team", sa.String(253), nullable=False, server_default=""),
        sa.Column("first_seen", _TS, nullable=False),
        sa.Column("last_seen", _TS, nullable=False),
        sa.UniqueConstraint("cluster", "namespace", "lineage", name="uq_lineages_identity"),
    )
    op.create_table(
        "lineage_runs",
        sa.Column("lineage_id", sa.Integer(), sa.ForeignKey("lineages.id", ondelete="CASCADE"), nullable=False),
        sa.Column("job_kind", sa.String(253), nullable=False),
        sa.Column("job_name", sa.String(253), nullable=False),
        sa.Column("job_uid", sa.String(64), nullable=False),
        sa.Column("verdict", sa.String(64), nullable=False),
        sa.Column("findings", _JSON, nullable=False),
        sa.Column("start", _TS, nullable=True),
        sa.Column("end", _TS, nullable=True),
        sa.Column("gpu_hours", sa.Float(), nullable=True),
        sa.Column("waste_gpu_hours", sa.Float(), nullable=True),
        sa.Column("final", sa.Boolean(), nullable=False),
        sa.Column("recorded_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("lineage_id", "job_kind", "job_name", "job_uid", name="pk_lineage_runs"),
    )
    op.create_index("ix_lineage_runs_start", "lineage_runs", ["lineage_id", "start"])
    op.create_index("ix_lineage_runs_job", "lineage_runs", ["job_name", "job_kind"])
    op.create_table(
        "lineage_acks",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("lineage_id", sa.Integer(), sa.ForeignKey("lineages.id", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("by", sa.String(253), nullable=False),
        sa.Column("at", _TS, nullable=False),
        sa.Column("until", _TS, nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("via", sa.String(32), nullable=False),
        sa.Column("link_id", sa.String(128), nullable=True, unique=True),
    )
    op.create_index("ix_lineage_acks_lineage", "lineage_acks", ["lineage_id", "at"])
    op.create_index("ix_lineage_acks_at", "lineage_acks", ["at"])


def downgrade() -> None:
    op.drop_index("ix_lineage_acks_at", table_name="lineage_acks")
    op.drop_index("ix_lineage_acks_lineage", table_name="lineage_acks")
    op.drop_table("lineage_acks")
    op.drop_index("ix_lineage_runs_job", table_name="lineage_runs")
    op.drop_index("ix_lineage_runs_start", table_name="lineage_runs")
    op.drop_table("lineage_runs")
    op.drop_table("lineages")
