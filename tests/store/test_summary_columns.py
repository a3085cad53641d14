"""Migration 0005 on a store that already holds summaries: the new columns of ``job_summaries``
are backfilled from the documents exactly as ``Store.save_summary`` fills them, and the weekly
report comes out the same as from a store written at the new revision. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from auditor.reports import IsoWeek, Prices, ReportOptions, generate, iter_jobs
from auditor.reports.weeks import zone
from auditor.store import Store
from auditor.store.store import SUMMARY_FIELDS, summary_columns
from auditor.store.tables import BucketRow, JobRow, SummaryRow
from auditor.store.urls import resolve

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reports"))
from reportgen import GenJob, store_jobs
from revisions import store_at

W = IsoWeek(2026, 47)
WS, WE = W.bounds(zone("UTC"))
NOW = WE + timedelta(hours=8)
OPTS = ReportOptions(prices=Prices({"NVIDIA H200": 4.0}, default=2.0))
JOBS = [
    GenJob("a", "healthy", WS + timedelta(hours=10), 6, 2, "healthy"),
    GenJob("a", "spin", WS + timedelta(days=1), 4, 1, "low_sm"),
    GenJob("a", "nosm", WS + timedelta(days=2), 2, 1, "no_sm", model="NVIDIA A100"),
    GenJob("b", "cross", WE - timedelta(hours=4), 12, 1, "low_sm"),  # split through the rollup
    GenJob("b", "early", WS - timedelta(hours=2), 4, 2, "healthy"),
    GenJob("c", "under", WS + timedelta(days=3), 3, 4, "underutilized"),
]
#: fields with other JSON types than the columns': the backfill leaves them NULL, like save_summary
ODD = {
    "job": None,
    "gpu_model": 7,
    "busy_signal": ["gpu_util"],
    "sm_active": 1,
    "tensor_active": True,
    "coverage": "0.9",
    "mfu_estimate": "0.1",
    "mfu_class": 3,
    "stats": {"gpu_util": {"samples": 12.0}, "gr_engine_active": {"samples": 10**20}},
}


def _tables() -> list[sa.Table]:
    return [m.__table__ for m in (JobRow, BucketRow, SummaryRow)]  # type: ignore[attr-defined]


def _rows_written_at_head() -> dict[str, list[dict]]:
    """jobs, buckets and summaries as the store writes them (a scratch in-memory store), the
    summaries without the columns that revision 0004 does not have."""
    with Store.open("sqlite://") as ref:
        store_jobs(ref, JOBS, now=NOW)
        odd_id = ref.find_job("ns-c", "Job", "under")[0]  # type: ignore[index]
        with ref._engine.connect() as conn:
            rows = {t.name: [dict(r) for r in conn.execute(sa.select(t)).mappings()] for t in _tables()}
    for r in rows["job_summaries"]:
        for column in SUMMARY_FIELDS:
            del r[column]
        if r["job_id"] == odd_id:
            r["data"] = {**r["data"], **ODD}
    return rows


def _store_at_0004_with(url: str, rows: dict[str, list[dict]]) -> None:
    store_at(url, "0004", {t: rows[t.name] for t in _tables()})
    engine = sa.create_engine(resolve(url))
    try:
        with engine.connect() as conn:
            assert "gpu_model" not in {c["name"] for c in sa.inspect(conn).get_columns("job_summaries")}
    finally:
        engine.dispose()


def _reports(store: Store) -> tuple[dict, list[dict], dict]:
    return (
        generate(store, W, now=NOW, options=OPTS),
        list(iter_jobs(store, W, options=OPTS)),
        generate(store, W.shift(1), now=NOW, options=OPTS),
    )


def test_upgrade_from_0004_backfills_the_summary_columns(store_url: str) -> None:
    rows = _rows_written_at_head()
    _store_at_0004_with(store_url, rows)
    with Store.open(store_url) as store:  # migrates 0004 → head: the backfill
        c = SummaryRow.__table__.c  # type: ignore[attr-defined]
        q = sa.select(c.job_id, c.data, *[c[k] for k in SUMMARY_FIELDS]).order_by(c.job_id)
        with store._engine.connect() as conn:
            got = {r[0]: (r[1], dict(zip(SUMMARY_FIELDS, r[2:]))) for r in conn.execute(q)}
        assert len(got) == len(JOBS)
        for doc, columns in got.values():
            assert columns == summary_columns(doc)
        by_model = {doc["gpu_model"]: columns for doc, columns in got.values()}
        assert by_model[7] == dict.fromkeys(SUMMARY_FIELDS) | {"sm_active": 1.0}
        assert by_model["NVIDIA A100"]["job"] == "Job/nosm" and by_model["NVIDIA A100"]["sm_active"] is None
        healthy = next(columns for doc, columns in got.values() if doc["job"] == "Job/healthy")
        assert healthy == {
            "job": "Job/healthy",
            "gpu_model": "NVIDIA H200",
            "busy_signal": "gpu_util",
            "sm_active": 0.82,
            "tensor_active": 0.45,
            "coverage": 1.0,
            "gpu_util_samples": 6 * 12 * 2 * 10,  # 6 h of 5-minute buckets, 2 GPUs, 10 samples each
            "gr_engine_active_samples": None,
            # 0010: the estimate of every summary; no reference in a document written without one
            "mfu_estimate": healthy["mfu_estimate"],
            "mfu_reference": None,
            "mfu_class": None,
            "recoverable_gpu_hours": None,
        }
        # no clock series: tensor × the assumed clock share (1 − 0.3 × tensor) × 0.97 (issue 28, core)
        assert healthy["mfu_estimate"] == pytest.approx(0.45 * (1 - 0.3 * 0.45) * 0.97, abs=0.01)

        upgraded = _reports(store)
        teams = {t["team"]: t for t in upgraded[0]["teams"]}
        assert teams["a"]["gpu_hours"] == 18 and teams["a"]["tensor_active_gpu_hours"] == 5.4
        assert {j["job"]: j["split"] for j in upgraded[1]}["Job/cross"] == "rollup"
        # the same store with every summary written again by save_summary: the same reports
        for job_id, (doc, _) in got.items():
            store.save_summary(job_id, doc)
        assert _reports(store) == upgraded


def test_week_queries_on_sqlite_read_the_week_index(tmp_path) -> None:
    """Without ANALYZE statistics (the store never runs it) SQLite must still take the week's
    range of ``ix_job_summaries_week``: not a walk of the whole table in key order, nor of
    every summary of the cluster through ``ix_job_summaries_scope`` (a report with a cluster,
    as the operator sends it, took 49 s instead of 2 s over 1.1 M summaries)."""
    with Store.open(f"sqlite:///{tmp_path}/store.db") as store:
        store_jobs(store, JOBS, now=NOW)
        statements: list[tuple[str, object]] = []

        def record(conn, cursor, statement, parameters, context, executemany) -> None:
            if "FROM job_summaries" in statement and "job_summaries.job_id IN" not in statement:
                statements.append((statement, parameters))

        sa.event.listen(store._engine, "before_cursor_execute", record)
        try:
            for cluster in (None, "c1"):
                doc = generate(store, W, now=NOW, options=ReportOptions(cluster=cluster))
                assert doc["total"]["jobs"] == len(JOBS)  # every job overlaps the week
        finally:
            sa.event.remove(store._engine, "before_cursor_execute", record)
        assert len(statements) >= 2 * 6
        with store._engine.connect() as conn:
            for statement, parameters in statements:
                plan = " / ".join(r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters))  # type: ignore[arg-type]
                assert "ix_job_summaries_week" in plan and "ix_job_summaries_scope" not in plan, (statement, plan)
