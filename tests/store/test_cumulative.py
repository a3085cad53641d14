"""Cumulative audits the operator's way, on SQLite and PostgreSQL: cycle after cycle, each job's
summary covers its whole history while a cycle reads back none of the older buckets; a rewrite
of older buckets or an unreadable aggregate makes the next cycle rebuild it from the buckets."""

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from counting import CountingStore

from auditor.core.model import PodRef, Window
from auditor.correlate import NoKubeResolver
from auditor.engine import align_down, run_audit
from auditor.sources.replay import ReplaySource
from auditor.store import Store
from auditor.traces import TraceJob, load_trace, make_gpus

END = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
START = END - timedelta(hours=1)
W = timedelta(minutes=5)


def source() -> ReplaySource:
    tr = load_trace("h200-demo-cluster")
    jobs = [
        TraceJob(PodRef("a", "train-0"), make_gpus(2, "n2"), "resnet50_bf16_training"),
        TraceJob(
            PodRef("b", "short"),
            make_gpus(1, "n3"),
            "resnet50_bf16_training",
            duration=timedelta(minutes=22),
            end_offset=timedelta(minutes=27),
        ),
        TraceJob(PodRef("b", "spin"), make_gpus(1, "n4"), "kernel_spin_waiting_4_blocks"),
    ]
    return ReplaySource([(tr, jobs)], end=END, duration=timedelta(hours=1))


def cycles(store, ends: list[datetime]) -> list[tuple[dict, int]]:
    """Operator-style windows: each starts where the previous ended, aligned down to a bucket."""
    out = []
    start = START
    counting = CountingStore(store)
    for end in ends:
        counting.read = 0
        res = run_audit(source(), NoKubeResolver("c1"), counting, Window(start, end), now=end, cumulative=True)
        out.append(({s.job: s.to_json() for s in res.summaries}, counting.read))
        start = align_down(end, W)
    return out


def comparable(s: dict) -> dict:
    return {k: v for k, v in s.items() if k not in ("window", "computed_at")}


ENDS = [START + timedelta(minutes=m, seconds=13) for m in (7, 19, 20, 31, 44, 52)] + [END]


def test_cycles_equal_one_audit_of_the_whole_history_without_reading_it_again(store_url: str) -> None:
    whole = {
        s.job: s.to_json()
        for s in run_audit(source(), NoKubeResolver("c1"), None, Window(START, END), now=END).summaries
    }
    with Store.open(store_url) as store:
        results = cycles(store, ENDS)
        last, _ = results[-1]
        assert set(last) == {"Pod/train-0", "Pod/spin"}  # "short" ended in an earlier cycle
        for job in last:
            assert comparable(last[job]) == comparable(whole[job]), job
        # the job that ended keeps the summary of its last cycle, equal to the whole-window one
        assert comparable(store.summary(store.find_job("b", "Pod", "short")[0])) == comparable(whole["Pod/short"])
        # no cycle read a stored bucket back: the older history came folded in the aggregates
        assert [read for _, read in results] == [0] * len(ENDS)
        assert whole["Pod/train-0"]["gpu_hours"] == pytest.approx(2.0, abs=0.01)


def test_rewritten_history_or_an_unreadable_aggregate_is_rebuilt_from_the_buckets(store_url: str) -> None:
    whole = {
        s.job: s.to_json()
        for s in run_audit(source(), NoKubeResolver("c1"), None, Window(START, END), now=END).summaries
    }
    with Store.open(store_url) as store:
        cycles(store, ENDS[:3])
        job_id = store.find_job("a", "Pod", "train-0")[0]
        assert store.aggregate(job_id) is not None
        # a one-shot audit rewrites older buckets: the aggregates that folded them are dropped
        run_audit(source(), NoKubeResolver("c1"), store, Window(START, START + timedelta(minutes=10)), now=END)
        assert store.aggregate(job_id) is None
        # ... and the spin job's aggregate is garbage (a partial write by hand, say)
        spin_id = store.find_job("b", "Pod", "spin")[0]
        with store._engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE job_aggregates SET state = :s WHERE job_id = :j"), {"s": b"{not json", "j": spin_id}
            )
        assert store.aggregate(spin_id) is None
        start = align_down(ENDS[2], W)
        counting = CountingStore(store)
        res = run_audit(source(), NoKubeResolver("c1"), counting, Window(start, END), now=END, cumulative=True)
        assert counting.read > 0  # rebuilt from the stored buckets
        got = {s.job: s.to_json() for s in res.summaries}
        for job in ("Pod/train-0", "Pod/spin"):
            assert comparable(got[job]) == comparable(whole[job]), job
        assert store.aggregate(spin_id) is not None


def test_upgrade_from_0003_keeps_the_buckets_under_the_new_key(store_url: str) -> None:
    """Migration 0004 reorders the buckets' primary key to (job, start, …): SQLite rebuilds the
    table, PostgreSQL the constraint; every bucket stays, and so does the cascade from jobs."""
    from revisions import store_at

    from auditor.store.tables import BucketRow, JobRow

    with Store.open("sqlite://") as ref:  # rows as the store writes them
        run_audit(source(), NoKubeResolver("c1"), ref, Window(START, END), now=END)
        with ref._engine.connect() as conn:
            rows = {
                t.name: [dict(r) for r in conn.execute(sa.select(t)).mappings()]
                for t in (JobRow.__table__, BucketRow.__table__)
            }
    assert len(rows["gpu_buckets"]) > 400
    store_at(store_url, "0003", {t: rows[t.name] for t in (JobRow.__table__, BucketRow.__table__)})
    with Store.open(store_url) as store:
        with store._engine.connect() as conn:
            pk = sa.inspect(conn).get_pk_constraint("gpu_buckets")
            assert pk["constrained_columns"][:2] == ["job_id", "start"] and len(pk["constrained_columns"]) == 8
            got = [dict(r) for r in conn.execute(sa.select(BucketRow.__table__)).mappings()]
        key = lambda r: (r["job_id"], r["start"], r["pod_name"], r["gpu_uuid"], r["metric"])  # noqa: E731
        assert sorted(got, key=key) == sorted(rows["gpu_buckets"], key=key)
        # cycles work on the upgraded store, and deleting a job still takes its buckets along
        cycles(store, ENDS[-2:])
        job_id = store.find_job("b", "Pod", "spin")[0]
        with store._engine.begin() as conn:
            conn.execute(sa.delete(JobRow.__table__).where(JobRow.__table__.c.id == job_id))
        assert store.buckets(job_id) == []
