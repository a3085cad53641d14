"""Policies: violations (escalation state), decisions and actions with their dedup keys.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

Why three tables:
- ``policy_violations`` is the escalation state of one violation episode (a job breaking one
  policy from the first cycle it fires until it stops firing): which step comes next and when the
  last one ran. A restart or a new leader reads it and continues, never restarts the ladder.
- ``policy_decisions`` records every step decided (what, why, the evidence, dry-run or not). Its
  ``dedup_key`` is unique, so two replicas or a replayed cycle cannot record the same step twice.
- ``policy_actions`` records every side effect of a decision (annotate, event, slack, webhook,
  requeue) with its result. Its unique ``dedup_key`` is claimed *before* the side effect runs, so
  the effect happens at most once; a requeue keeps ``due_at`` for its reactivation.

Frozen once shipped, like 0001: later changes come as new revisions. Types are spelled out.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)
_JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def _job_columns() -> list[sa.Column]:
    return [
        sa.Column("cluster", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("kind", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "policy_violations",
        sa.Column("id", sa.Integer(), primary_key=True, nullable=False),
        *_job_columns(),
        sa.Column("uid", sa.String(64), nullable=True),
        sa.Column("policy", sa.String(253), nullable=False),
        sa.Column("episode", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),  # open | closed
        sa.Column("opened_at", _TS, nullable=False),
        sa.Column("last_seen_at", _TS, nullable=False),
        sa.Column("closed_at", _TS, nullable=True),
        sa.Column("next_step", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("last_step_at", _TS, nullable=True),
        sa.Column("evidence", _JSON, nullable=False),
        sa.UniqueConstraint(
            "cluster", "namespace", "kind", "name", "policy", "episode", name="uq_policy_violations_episode"
        ),
    )
    op.create_index("ix_policy_violations_state", "policy_violations", ["state", "cluster"])

    op.create_table(
        "policy_decisions",
        sa.Column("id", sa.Integer(), primary_key=True, nullable=False),
        sa.Column("dedup_key", sa.String(700), nullable=False),
        sa.Column(
            "violation_id", sa.Integer(), sa.ForeignKey("policy_violations.id", ondelete="CASCADE"), nullable=True
        ),
        *_job_columns(),
        sa.Column("policy", sa.String(253), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("actions", _JSON, nullable=False),
        sa.Column("decided_at", _TS, nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("verdict", sa.String(64), nullable=False, server_default=""),
        sa.Column("reason", sa.Text(), nullable=False, server_default=""),
        sa.Column("evidence", _JSON, nullable=False),
        sa.UniqueConstraint("dedup_key", name="uq_policy_decisions_dedup"),
    )
    op.create_index("ix_policy_decisions_decided_at", "policy_decisions", ["decided_at"])
    op.create_index("ix_policy_decisions_job", "policy_decisions", ["cluster", "namespace", "kind", "name"])

    op.create_table(
        "policy_actions",
        sa.Column("id", sa.Integer(), primary_key=True, nullable=False),
        sa.Column("dedup_key", sa.String(760), nullable=False),
        sa.Column("decision_id", sa.Integer(), sa.ForeignKey("policy_decisions.id", ondelete="CASCADE"), nullable=True),
        *_job_columns(),
        sa.Column("policy", sa.String(253), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),  # claimed | done | failed | skipped | waiting
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.Column("due_at", _TS, nullable=True),
        sa.Column("result", _JSON, nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.UniqueConstraint("dedup_key", name="uq_policy_actions_dedup"),
    )
    op.create_index("ix_policy_actions_created_at", "policy_actions", ["action", "created_at"])
    op.create_index("ix_policy_actions_due", "policy_actions", ["state", "due_at"])
    op.create_index("ix_policy_actions_job", "policy_actions", ["cluster", "namespace", "kind", "name"])


def downgrade() -> None:
    op.drop_table("policy_actions")
    op.drop_table("policy_decisions")
    op.drop_table("policy_violations")
