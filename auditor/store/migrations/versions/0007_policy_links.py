"""Indexes on the escalation record's links: actions by decision, decisions by violation.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

Retention (auditor/store/retention.py) deletes finished escalation episodes: their actions,
then their decisions, then their violations. Both links are foreign keys with ``ON DELETE
CASCADE``, so deleting a decision makes the database look for its actions, and deleting a
violation for its decisions; without an index on the referencing column that is a scan of the
whole child table per deleted row. Measured on SQLite with 10,000 episodes (20,000 actions):
the first prune of that backlog spent 15.6 s deleting 4,286 decisions and 6.1 s deleting their
violations, everything else together 0.8 s. Frozen once shipped, like 0001.
"""

from __future__ import annotations

from typing import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_policy_actions_decision", "policy_actions", ["decision_id"])
    op.create_index("ix_policy_decisions_violation", "policy_decisions", ["violation_id"])


def downgrade() -> None:
    op.drop_index("ix_policy_decisions_violation", table_name="policy_decisions")
    op.drop_index("ix_policy_actions_decision", table_name="policy_actions")
