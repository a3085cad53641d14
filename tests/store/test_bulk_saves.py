"""One cycle's summaries and aggregates written in one statement per table (issue 18) leave the
store exactly as one call per job does, on SQLite and PostgreSQL: the summaries with their
columns, the lineages (team, last seen) and their runs, the aggregates; and a refused summary
writes nothing of the batch."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

from auditor.core.accumulate import JobAggregate
from auditor.core.model import JobRef
from auditor.errors import StoreError
from auditor.store.store import Store

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)


def _doc(job: JobRef, verdict: str, hours: float, team: str | None) -> dict:
    doc: dict = {
        "cluster": job.cluster,
        "namespace": job.namespace,
        "job": f"{job.kind}/{job.name}",
        "verdict": verdict,
        "start": "2026-11-30T09:00:00Z",
        "end": "2026-11-30T12:00:00Z",
        "gpu_hours": hours,
        "waste_gpu_hours": hours / 2,
        "findings": [{"code": "low_sm_activity", "message": "m", "evidence": {"x": 1}}],
        "stats": {"gpu_util": {"samples": 7}},
        "computed_at": "2026-11-30T12:00:00Z",
        "final": False,
    }
    if team is not None:
        doc["team"] = team
    return doc


def _contents(store: Store, cluster: str) -> dict:
    """What the saves left for ``cluster``'s jobs, without row ids (two clusters share a store)."""
    queries = {
        "summaries": "SELECT j.name, s.verdict, s.gpu_hours, s.waste_gpu_hours, s.team, s.data FROM job_summaries s "
        "JOIN jobs j ON j.id = s.job_id WHERE j.cluster = :c ORDER BY j.name",
        "lineages": "SELECT lineage, team, first_seen, last_seen FROM lineages WHERE cluster = :c ORDER BY lineage",
        "runs": "SELECT r.job_name, r.job_uid, r.verdict, r.findings, r.gpu_hours, r.final, r.recorded_at "
        "FROM lineage_runs r JOIN lineages l ON l.id = r.lineage_id WHERE l.cluster = :c ORDER BY r.job_name",
        "aggregates": "SELECT j.name, a.through, a.updated, a.state FROM job_aggregates a "
        "JOIN jobs j ON j.id = a.job_id WHERE j.cluster = :c ORDER BY j.name",
    }
    with store.reading("compare") as conn:
        out = {k: [tuple(r) for r in conn.execute(sa.text(q), {"c": cluster})] for k, q in queries.items()}
    docs = [json.loads(d) if isinstance(d, str) else dict(d) for *_, d in out["summaries"]]
    assert all(d.pop("cluster") == cluster for d in docs)
    out["summaries"] = [(*row[:-1], d) for row, d in zip(out["summaries"], docs)]
    return out


def _write(store: Store, cluster: str, *, bulk: bool) -> None:
    jobs = [JobRef(cluster, "ml", "Job", f"train-{k}", uid=f"u{k}", team="vision" if k % 2 else "") for k in range(4)]
    ids = [store.upsert_job(j, T0, T0 + timedelta(hours=3)) for j in jobs]
    # a job given twice (the later wins), a team given by some summaries only
    items = [
        (ids[0], _doc(jobs[0], "idle", 1.0, None)),
        (ids[1], _doc(jobs[1], "healthy", 2.0, "vision")),
        (ids[2], _doc(jobs[2], "low_sm_efficiency", 3.0, "research")),
        (ids[0], _doc(jobs[0], "healthy", 4.0, None)),
        (ids[3], _doc(jobs[3], "idle", 5.0, "")),
    ]
    aggs = []
    for k, job_id in enumerate(ids):
        agg = JobAggregate()
        agg.freeze(T0 + timedelta(minutes=5 * k))
        agg.interval = 15.0
        aggs.append((job_id, agg))
    if bulk:
        with store.batch():
            store.save_summaries(items)
            store.save_aggregates(aggs + aggs[:1], T0)
    else:
        for job_id, doc in items:
            store.save_summary(job_id, doc)
        for job_id, agg in aggs + aggs[:1]:
            store.save_aggregate(job_id, agg, T0)


def test_bulk_saves_store_what_one_call_per_job_stores(store_url: str) -> None:
    with Store.open(store_url) as store:
        _write(store, "bulk", bulk=True)
        _write(store, "calls", bulk=False)
        bulk, calls = _contents(store, "bulk"), _contents(store, "calls")
        assert bulk == calls
        assert [(name, verdict, hours) for name, verdict, hours, *_ in bulk["summaries"]] == [
            ("train-0", "healthy", 4.0),
            ("train-1", "healthy", 2.0),
            ("train-2", "low_sm_efficiency", 3.0),
            ("train-3", "idle", 5.0),
        ]
        assert len(bulk["runs"]) == 4 and len(bulk["aggregates"]) == 4


def test_a_refused_summary_writes_none_of_the_batch(store_url: str) -> None:
    with Store.open(store_url) as store:
        job = JobRef("c1", "ml", "Job", "train-a", uid="u")
        job_id = store.upsert_job(job, T0, T0 + timedelta(hours=1))
        bad = _doc(job, "idle", 1.0, None)
        del bad["verdict"]
        with pytest.raises(StoreError, match="save summary of job .*no verdict"):
            store.save_summaries([(job_id, _doc(job, "idle", 1.0, None)), (job_id + 1000, bad)])
        assert store.summaries() == []
        with pytest.raises(StoreError, match="no job with id"):
            store.save_summaries(
                [(job_id, _doc(job, "idle", 1.0, None)), (job_id + 1000, _doc(job, "idle", 1.0, None))]
            )
        assert store.summaries() == []


class OneJobAtATime:
    """The store with its group writes made one job at a time (one upsert and one bucket write
    per job, the path every store took before): the reference for the group writes."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def upsert_jobs(self, items: Any) -> list[int]:
        return [self._store.upsert_job(job, first, last) for job, first, last in items]

    def replace_buckets_many(self, items: Any) -> list:
        return [self._store.replace_buckets(job_id, buckets) for job_id, buckets in items]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _rows(store: Store) -> dict:
    queries = {
        "buckets": "SELECT j.kind, j.name, b.pod_name, b.gpu_uuid, b.metric, b.start, b.total, b.count "
        "FROM gpu_buckets b JOIN jobs j ON j.id = b.job_id ORDER BY 1, 2, 3, 4, 5, 6",
        "owners": "SELECT j.kind, j.name, o.pod_name, o.first_start, o.last_start FROM gpu_pod_owners o "
        "JOIN jobs j ON j.id = o.job_id ORDER BY 1, 2, 3",
        "aggregates": "SELECT j.kind, j.name, a.through FROM job_aggregates a JOIN jobs j ON j.id = a.job_id ORDER BY 1, 2",
        "summaries": "SELECT j.kind, j.name, s.verdict, s.gpu_hours FROM job_summaries s "
        "JOIN jobs j ON j.id = s.job_id ORDER BY 1, 2",
    }
    with store.reading("compare") as conn:
        return {k: [tuple(r) for r in conn.execute(sa.text(q))] for k, q in queries.items()}


@pytest.mark.parametrize("order", ["kube, then no-kube", "no-kube, then kube"])
def test_group_writes_settle_gpu_claims_as_one_write_per_job(store_url: str, tmp_path, order: str) -> None:
    """Two identities of the same pods (the GPU-ownership cases of tests/store/test_gpu_ownership.py)
    in the operator's cumulative cycles: the group writes leave the rows and warnings of one
    write per job."""
    from test_gpu_ownership import END, KUBE, NO_KUBE, WINDOW, source

    from auditor.engine import run_audit

    resolvers = [KUBE, NO_KUBE] if order.startswith("kube") else [NO_KUBE, KUBE]
    got = {}
    for label, url in (("group", store_url), ("per job", f"sqlite:///{tmp_path / 'per-job.db'}")):
        with Store.open(url) as store:
            target = store if label == "group" else OneJobAtATime(store)
            warnings = []
            for resolver in resolvers:
                audit = run_audit(source(), resolver, target, WINDOW, now=END, cumulative=True)  # type: ignore[arg-type]
                warnings.append(sorted(audit.report.warnings))
            got[label] = (_rows(store), warnings)
    assert got["group"][1] == got["per job"][1]
    assert any("two job identities" in w for ws in got["group"][1] for w in ws)
    group, per_job = got["group"][0], got["per job"][0]
    for table in group:
        assert len(group[table]) == len(per_job[table]), table
        if store_url.startswith("sqlite"):
            assert group[table] == per_job[table], table
