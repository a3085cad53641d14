"""The escalation record's tables (migration 0002, indexes in 0007): violations, decisions, actions.

Declared once here for every reader: the decision log (:mod:`auditor.store.decisions`), the
weekly report's action counts (:mod:`auditor.store.reports`) and retention.
"""

from __future__ import annotations

import sqlalchemy as sa

from auditor.store.tables import JSONDoc, UTCDateTime

_md = sa.MetaData()


def _job_cols() -> list[sa.Column]:
    return [
        sa.Column("cluster", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("kind", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
    ]


violations = sa.Table(
    "policy_violations",
    _md,
    sa.Column("id", sa.Integer, primary_key=True),
    *_job_cols(),
    sa.Column("uid", sa.String(64)),
    sa.Column("policy", sa.String(253), nullable=False),
    sa.Column("episode", sa.Integer, nullable=False),
    sa.Column("state", sa.String(32), nullable=False),
    sa.Column("opened_at", UTCDateTime, nullable=False),
    sa.Column("last_seen_at", UTCDateTime, nullable=False),
    sa.Column("closed_at", UTCDateTime),
    sa.Column("next_step", sa.Integer, nullable=False),
    sa.Column("last_step_at", UTCDateTime),
    sa.Column("evidence", JSONDoc, nullable=False),
)
decisions = sa.Table(
    "policy_decisions",
    _md,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("dedup_key", sa.String(700), nullable=False, unique=True),
    sa.Column("violation_id", sa.Integer),
    *_job_cols(),
    sa.Column("policy", sa.String(253), nullable=False),
    sa.Column("mode", sa.String(16), nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("actions", JSONDoc, nullable=False),
    sa.Column("decided_at", UTCDateTime, nullable=False),
    sa.Column("dry_run", sa.Boolean, nullable=False),
    sa.Column("verdict", sa.String(64), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("evidence", JSONDoc, nullable=False),
)
actions = sa.Table(
    "policy_actions",
    _md,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("dedup_key", sa.String(760), nullable=False, unique=True),
    sa.Column("decision_id", sa.Integer),
    *_job_cols(),
    sa.Column("policy", sa.String(253), nullable=False),
    sa.Column("action", sa.String(64), nullable=False),
    sa.Column("state", sa.String(32), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    sa.Column("due_at", UTCDateTime),
    sa.Column("result", JSONDoc, nullable=False),
    sa.Column("error", sa.Text),
)
