"""Summary columns: the fields the weekly report reads, copied out of the summary document.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

The weekly report read ``gpu_model``, ``tensor_active``, ``sm_active``, ``coverage``, ``job``,
``busy_signal`` and the busy signals' sample counts out of ``job_summaries.data`` in SQL. On
SQLite every such read parses the whole ~3.5 kB document (~35 µs each), which made a week of
100,000 jobs miss its time target (bench/results/reports-2026-11-30.md). They become real columns,
written by ``Store.save_summary`` beside ``data`` (which stays the full record), and NULL where the
document lacks the field or holds another JSON type there (booleans are not numbers; integers are
whole numbers below 10^18).

Existing rows are backfilled here from their documents, with the same types, on both databases;
nothing else changes and nothing is lost. (SQLite: one ``UPDATE`` that parses each document once
per row; PostgreSQL rewrites every summary row once, so the table is twice its size until the next
autovacuum.)

``ix_job_summaries_week`` covers the week's queries: the week's ``GROUP BY`` (team, verdict, GPU
model, hours, waste, tensor activity), the waste ranking and the team list read only the index,
and the scan for jobs crossing a week's bounds checks ``end``/``start`` there before it reads a
row. It starts with ``end``, so it replaces ``ix_job_summaries_end`` (0001), which is dropped:
SQLite's planner, seeing two indexes on ``end`` of equal estimated cost, took the narrow one and
read a table row for every job of the weeks scanned. Frozen once shipped, like 0001: types are
spelled out, not imported from the package.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: column → (path in ``data``, JSON type, column type)
_FIELDS: dict[str, tuple[tuple[str, ...], str, sa.types.TypeEngine]] = {
    "job": (("job",), "string", sa.Text()),
    "gpu_model": (("gpu_model",), "string", sa.Text()),
    "busy_signal": (("busy_signal",), "string", sa.Text()),
    "sm_active": (("sm_active",), "number", sa.Float()),
    "tensor_active": (("tensor_active",), "number", sa.Float()),
    "coverage": (("coverage",), "number", sa.Float()),
    "gpu_util_samples": (("stats", "gpu_util", "samples"), "integer", sa.BigInteger()),
    "gr_engine_active_samples": (("stats", "gr_engine_active", "samples"), "integer", sa.BigInteger()),
}

_INDEX = "ix_job_summaries_week"
_INDEX_COLUMNS = [
    "end",
    "start",
    "cluster",
    "team",
    "verdict",
    "gpu_model",
    "gpu_hours",
    "waste_gpu_hours",
    "tensor_active",
    "job_id",
]


def _sqlite(path: tuple[str, ...], kind: str) -> str:
    p = "'$" + "".join(f'."{k}"' for k in path) + "'"
    typ, val = f"json_type(data, {p})", f"json_extract(data, {p})"
    cond = {
        "string": f"{typ} = 'text'",
        "number": f"{typ} IN ('integer', 'real') AND abs({val}) < 1e300",
        "integer": f"{typ} = 'integer' AND abs({val}) < 1e18",
    }[kind]
    return f"CASE WHEN {cond} THEN {val} END"


def _postgresql(path: tuple[str, ...], kind: str) -> str:
    p = "'{" + ",".join(path) + "}'"
    node, text = f"(data #> {p})", f"(data #>> {p})"
    if kind == "string":
        return f"CASE WHEN jsonb_typeof({node}) = 'string' THEN {text} END"
    # nested CASEs: PostgreSQL may evaluate an AND's operands in any order, and a cast of
    # a non-number would fail the whole migration
    if kind == "number":
        return (
            f"CASE WHEN jsonb_typeof({node}) = 'number' THEN "
            f"CASE WHEN abs({text}::numeric) < 1e300 THEN {text}::double precision END END"
        )
    return (
        f"CASE WHEN jsonb_typeof({node}) = 'number' AND {text} ~ '^-?[0-9]+$' THEN "
        f"CASE WHEN abs({text}::numeric) < 1e18 THEN {text}::bigint END END"
    )


def upgrade() -> None:
    for name, (_, _, typ) in _FIELDS.items():
        op.add_column("job_summaries", sa.Column(name, typ, nullable=True))
    extract = _postgresql if op.get_bind().dialect.name == "postgresql" else _sqlite
    sets = ", ".join(f"{name} = {extract(path, kind)}" for name, (path, kind, _) in _FIELDS.items())
    op.execute(f"UPDATE job_summaries SET {sets}")
    op.create_index(_INDEX, "job_summaries", _INDEX_COLUMNS)
    op.drop_index("ix_job_summaries_end", table_name="job_summaries")


def downgrade() -> None:
    op.create_index("ix_job_summaries_end", "job_summaries", ["end"])
    op.drop_index(_INDEX, table_name="job_summaries")
    with op.batch_alter_table("job_summaries") as batch:
        for name in reversed(list(_FIELDS)):
            batch.drop_column(name)
