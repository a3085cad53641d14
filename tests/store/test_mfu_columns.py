"""The MFU in the store (migration 0010, issue 28), on SQLite and PostgreSQL: the summary columns
``mfu_estimate``, ``mfu_reference``, ``mfu_class`` and ``recoverable_gpu_hours`` written with
every summary and backfilled from stored documents; each lineage run's MFU; and the lineage's
best earlier MFU that the engine takes as the ``lineage-best`` reference."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from revisions import assert_tables_match_migrations, store_at

from auditor.core.lineage import LINEAGE_LABEL
from auditor.core.model import JobRef
from auditor.store import Store
from auditor.store.lineage_tables import lineage_runs, lineages
from auditor.store.tables import JobRow, SummaryRow

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
_S = SummaryRow.__table__  # type: ignore[attr-defined]
_J = JobRow.__table__  # type: ignore[attr-defined]


@pytest.fixture
def store(store_url: str):
    s = Store.open(store_url)
    yield s
    s.close()


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _doc(job: JobRef, day: float, mfu: object, verdict: str = "healthy", **kw: object) -> dict:
    start = T0 + timedelta(days=day)
    return {
        "cluster": job.cluster,
        "namespace": job.namespace,
        "job": job.job,
        "team": job.team,
        "verdict": verdict,
        "start": _iso(start),
        "end": _iso(start + timedelta(hours=2)),
        "gpu_hours": 16.0,
        "waste_gpu_hours": 1.0,
        "computed_at": _iso(start + timedelta(hours=2)),
        "mfu_estimate": mfu,
        "findings": [],
        **kw,
    }


def _job(name: str, lineage: str | None = "train", ns: str = "ml") -> JobRef:
    labels = ((LINEAGE_LABEL, lineage),) if lineage else ()
    return JobRef("c1", ns, "Job", name, uid=f"uid-{name}", team="llm", labels=labels)


def _save(store: Store, job: JobRef, doc: dict) -> int:
    job_id = store.upsert_job(job, T0, T0 + timedelta(days=10))
    lineage = dict(job.labels).get(LINEAGE_LABEL)
    store.save_summary(job_id, {**doc, "kube": {"lineage": lineage}} if lineage else doc)
    return job_id


def _columns(store: Store) -> dict[str, tuple]:
    q = sa.select(_J.c.name, _S.c.mfu_estimate, _S.c.mfu_reference, _S.c.mfu_class, _S.c.recoverable_gpu_hours)
    with store._engine.connect() as conn:
        return {r[0]: tuple(r[1:]) for r in conn.execute(q.select_from(_S.join(_J, _J.c.id == _S.c.job_id)))}


def test_tables_match_the_migrations(store_url: str) -> None:
    Store.open(store_url).close()
    assert_tables_match_migrations(store_url, (_J, _S, lineage_runs, lineages))


def test_summary_columns_are_written_from_the_document(store: Store) -> None:
    a, b, c = _job("a", None), _job("b", None), _job("c", None)
    _save(
        store,
        a,
        _doc(a, 0, 0.16, "low_mfu", mfu_reference=0.4, mfu_class="llm-training", recoverable_gpu_hours=9.6),
    )
    _save(store, b, _doc(b, 0, 0.3))  # a document from before issue 28: no reference fields
    _save(store, c, _doc(c, 0, True, mfu_reference="0.4", mfu_class=7, recoverable_gpu_hours=None))
    assert _columns(store) == {
        "a": (0.16, 0.4, "llm-training", 9.6),
        "b": (0.3, None, None, None),
        "c": (None, None, None, None),  # other JSON types are NULL, as in 0005
    }


def test_upgrade_from_0009_backfills_summaries_and_lineage_runs(store_url: str) -> None:
    """A store at 0009 with summaries and lineage runs: after the upgrade the summaries' MFU
    columns hold what their documents say and each run has its job's MFU."""
    jobs = [_job("v1-x"), _job("v2-y"), _job("other", "else")]
    with Store.open("sqlite://") as scratch:  # the rows as the store writes them, at head
        docs = [
            _doc(jobs[0], 0, 0.45),
            _doc(jobs[1], 1, 0.16, "low_mfu", mfu_reference=0.45, mfu_class="lineage-best", recoverable_gpu_hours=10.3),
            _doc(jobs[2], 2, "n/a"),
        ]
        for job, doc in zip(jobs, docs):
            _save(scratch, job, doc)
        with scratch._engine.connect() as conn:
            rows = {
                t: [dict(r) for r in conn.execute(sa.select(t)).mappings()] for t in (_J, _S, lineages, lineage_runs)
            }
    for r in rows[_S]:
        for column in ("mfu_estimate", "mfu_reference", "mfu_class", "recoverable_gpu_hours"):
            del r[column]
    for r in rows[lineage_runs]:
        del r["mfu_estimate"]
    store_at(store_url, "0009", rows)
    with Store.open(store_url) as store:  # migrates 0009 → head
        assert _columns(store) == {
            "v1-x": (0.45, None, None, None),
            "v2-y": (0.16, 0.45, "lineage-best", 10.3),
            "other": (None, None, None, None),
        }
        with store._engine.connect() as conn:
            got = dict(conn.execute(sa.select(lineage_runs.c.job_name, lineage_runs.c.mfu_estimate)).all())
        assert got == {"v1-x": 0.45, "v2-y": 0.16, "other": None}
        # and the lineage-best reference reads them: v2 is measured against v1's 0.45
        assert store.lineage_best_mfu([jobs[1]]) == {jobs[1].key: 0.45}


def test_lineage_best_is_the_best_earlier_run_of_the_same_lineage(store: Store) -> None:
    v1, v2, v3, v4 = _job("train-v1"), _job("train-v2"), _job("train-v3"), _job("train-v4")
    short = _job("train-smoke")
    other = _job("eval-v1", "eval")
    _save(store, v1, _doc(v1, 0, 0.30))
    _save(store, short, _doc(short, 0.5, 0.90, "insufficient_data"))  # too little data: no reference
    _save(store, v2, _doc(v2, 1, 0.44))
    _save(store, other, _doc(other, 1, 0.70))  # another lineage
    _save(store, v3, _doc(v3, 2, 0.16))
    new = _job("train-v5")  # not recorded yet: every other run counts
    best = store.lineage_best_mfu([v1, v2, v3, new, v4, _job("solo", "solo")])
    assert best == {
        # v1 has no earlier run; v2 only v1; v3 the best of v1 and v2; v4 and v5 (no run of
        # their own yet) every run; a lineage of one job has none
        v2.key: 0.30,
        v3.key: 0.44,
        new.key: 0.44,
        v4.key: 0.44,
    }
    # the same job re-summarized keeps its own run out of its reference
    _save(store, v3, _doc(v3, 2, 0.50))
    assert store.lineage_best_mfu([v3, new]) == {v3.key: 0.44, new.key: 0.50}
    assert store.lineage_best_mfu([]) == {}


def test_lineage_best_reads_many_jobs_in_few_statements(store: Store) -> None:
    """A cycle of hundreds of jobs: a few statements per 500 lineages (their ids, the runs that
    set a lineage's best, the jobs' own runs), not one per job."""
    jobs = [_job(f"j{i}-v1", f"l{i}") for i in range(450)]
    later = [_job(f"j{i}-v2", f"l{i}") for i in range(450)]
    ids = store.upsert_jobs([(j, T0, T0 + timedelta(days=1)) for j in jobs])
    store.save_summaries(
        [
            (job_id, {**_doc(j, 0, round(0.001 * i, 3)), "kube": {"lineage": f"l{i}"}})
            for i, (job_id, j) in enumerate(zip(ids, jobs))
        ]
    )
    statements: list[str] = []

    def record(conn, cursor, statement, *rest) -> None:
        statements.append(statement)

    sa.event.listen(store._engine, "before_cursor_execute", record)
    try:
        best = store.lineage_best_mfu(later)
    finally:
        sa.event.remove(store._engine, "before_cursor_execute", record)
    # 900 candidate lineages (each job's label and its name) in two reads, the 450 found in two
    assert len([s for s in statements if s.startswith("SELECT")]) == 4
    assert len(best) == 449 and best[later[7].key] == 0.007  # j0's MFU 0.0 is no reference
