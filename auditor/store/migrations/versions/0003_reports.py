"""Weekly report deliveries: one row per (cluster, week, team, channel), claimed before sending.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

``dedup_key`` is unique: a sender inserts the row (state ``claimed``) *before* it posts the
report, so two replicas, or a restart that runs the same schedule again, cannot both send one
team's report for one week. ``sent`` is final; ``failed`` and a ``claimed`` row older than the
claim timeout (its sender died mid-send) may be claimed again. Frozen once shipped, like 0001.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)
_JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "report_deliveries",
        sa.Column("id", sa.Integer(), primary_key=True, nullable=False),
        sa.Column("dedup_key", sa.String(700), nullable=False),
        sa.Column("cluster", sa.String(253), nullable=False),
        sa.Column("week", sa.String(8), nullable=False),  # YYYY-Www
        sa.Column("team", sa.String(253), nullable=False),  # "*": the cluster-wide report
        sa.Column("channel", sa.String(64), nullable=False),  # slack | webhook
        sa.Column("status", sa.String(16), nullable=False),  # claimed | sent | failed
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("claimed_at", _TS, nullable=False),
        sa.Column("claimed_by", sa.String(253), nullable=False, server_default=""),
        sa.Column("sent_at", _TS, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("detail", _JSON, nullable=False),
        sa.UniqueConstraint("dedup_key", name="uq_report_deliveries_dedup"),
    )
    op.create_index("ix_report_deliveries_week", "report_deliveries", ["cluster", "week"])


def downgrade() -> None:
    op.drop_table("report_deliveries")
