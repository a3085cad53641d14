"""Job snoozes: who paused a running job's escalation ladder, when, until when, why (issue 30).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03

An alert's "Snooze this job's escalation" link, the console's button and ``gpu-auditor ack
--job`` record here that the policy runner must take no step on the job until ``until``. The gate's
acknowledgements (``lineage_acks``) are about a lineage's next submissions; a snooze is about
one running job, keyed like the decision log's tables by (cluster, namespace, kind, name). A
signed link's id is unique, so a snooze link is used once. Frozen once shipped, like 0001: types
are spelled out, not imported from the package.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "job_snoozes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("cluster", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("kind", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("by", sa.String(253), nullable=False),
        sa.Column("at", _TS, nullable=False),
        sa.Column("until", _TS, nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("via", sa.String(32), nullable=False),
        sa.Column("link_id", sa.String(128), nullable=True, unique=True),
    )
    op.create_index("ix_job_snoozes_until", "job_snoozes", ["cluster", "until"])
    op.create_index("ix_job_snoozes_job", "job_snoozes", ["cluster", "namespace", "name", "kind"])


def downgrade() -> None:
    op.drop_index("ix_job_snoozes_job", table_name="job_snoozes")
    op.drop_index("ix_job_snoozes_until", table_name="job_snoozes")
    op.drop_table("job_snoozes")
