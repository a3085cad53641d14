"""MFU columns: the MFU estimate, its reference and the GPU-hours of the MFU gap (issue 28).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03

The weekly report, the console and ``/metrics`` rank and sum jobs by their MFU and by the
GPU-hours they would have freed at their workload class's reference MFU. Like 0005, these
become real columns of ``job_summaries`` copied out of the summary document (``data`` stays the
full record): ``mfu_estimate``, ``mfu_reference``, ``recoverable_gpu_hours`` (floats) and
``mfu_class`` (the reference's source: a class name or ``lineage-best``), NULL where the document
lacks the field or holds another JSON type there. Existing rows are backfilled from their
documents on both databases: ``mfu_estimate`` from every stored summary; the other three are
absent from documents written before this version, so they stay NULL until the job is
summarized again (an old summary is never charged a gap it was not computed with).

``ix_job_summaries_week`` is rebuilt with ``mfu_estimate`` and ``recoverable_gpu_hours``, so that
the week's GPU-hour-weighted MFU and recoverable hours are read from the index as the rest of
the week's figures are (0005).

``lineage_runs`` gains the run's ``mfu_estimate``: a lineage's best earlier MFU is the
``lineage-best`` reference of its later runs. Backfilled from the summary of the run's job
where the store still holds it (same cluster, namespace, kind, name and uid).

Frozen once shipped, like 0001: types are spelled out, not imported from the package.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: column → (path in ``data``, JSON type, column type)
_FIELDS: dict[str, tuple[tuple[str, ...], str, sa.types.TypeEngine]] = {
    "mfu_estimate": (("mfu_estimate",), "number", sa.Float()),
    "mfu_reference": (("mfu_reference",), "number", sa.Float()),
    "mfu_class": (("mfu_class",), "string", sa.Text()),
    "recoverable_gpu_hours": (("recoverable_gpu_hours",), "number", sa.Float()),
}

_INDEX = "ix_job_summaries_week"
_OLD_INDEX_COLUMNS = [
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
_INDEX_COLUMNS = [*_OLD_INDEX_COLUMNS[:-1], "mfu_estimate", "recoverable_gpu_hours", "job_id"]


def _sqlite(path: tuple[str, ...], kind: str) -> str:
    p = "'$" + "".join(f'."{k}"' for k in path) + "'"
    typ, val = f"json_type(data, {p})", f"json_extract(data, {p})"
    cond = {
        "string": f"{typ} = 'text'",
        "number": f"{typ} IN ('integer', 'real') AND abs({val}) < 1e300",
    }[kind]
    return f"CASE WHEN {cond} THEN {val} END"


def _postgresql(path: tuple[str, ...], kind: str) -> str:
    p = "'{" + ",".join(path) + "}'"
    node, text = f"(data #> {p})", f"(data #>> {p})"
    if kind == "string":
        return f"CASE WHEN jsonb_typeof({node}) = 'string' THEN {text} END"
    # nested CASEs: PostgreSQL may evaluate an AND's operands in any order, and a cast of a
    # non-number would fail the whole migration
    return (
        f"CASE WHEN jsonb_typeof({node}) = 'number' THEN "
        f"CASE WHEN abs({text}::numeric) < 1e300 THEN {text}::double precision END END"
    )


#: each run's MFU from the stored summary of its job (the jobs row by identity)
_RUN_MFU = """
UPDATE lineage_runs SET mfu_estimate = (
    SELECT s.mfu_estimate FROM job_summaries s
    JOIN jobs j ON j.id = s.job_id
    JOIN lineages l ON l.cluster = j.cluster AND l.namespace = j.namespace
    WHERE l.id = lineage_runs.lineage_id
      AND j.kind = lineage_runs.job_kind
      AND j.name = lineage_runs.job_name
      AND COALESCE(j.uid, '') = lineage_runs.job_uid
)
"""


def upgrade() -> None:
    for name, (_, _, typ) in _FIELDS.items():
        op.add_column("job_summaries", sa.Column(name, typ, nullable=True))
    extract = _postgresql if op.get_bind().dialect.name == "postgresql" else _sqlite
    sets = ", ".join(f"{name} = {extract(path, kind)}" for name, (path, kind, _) in _FIELDS.items())
    op.execute(f"UPDATE job_summaries SET {sets}")
    op.drop_index(_INDEX, table_name="job_summaries")
    op.create_index(_INDEX, "job_summaries", _INDEX_COLUMNS)
    op.add_column("lineage_runs", sa.Column("mfu_estimate", sa.Float(), nullable=True))
    op.execute(_RUN_MFU)


def downgrade() -> None:
    with op.batch_alter_table("lineage_runs") as batch:
        batch.drop_column("mfu_estimate")
    op.drop_index(_INDEX, table_name="job_summaries")
    op.create_index(_INDEX, "job_summaries", _OLD_INDEX_COLUMNS)
    with op.batch_alter_table("job_summaries") as batch:
        for name in reversed(list(_FIELDS)):
            batch.drop_column(name)
