"""Cumulative audits the operator's way, on SQLite and PostgreSQL: cycle after cycle, each job's
summary covers its whole history while a cycle reads back none of the older buckets; a rewrite
of older buckets or an unreadable aggregate makes the next cycle rebuild it from the buckets."""

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from auditor.core.model import PodRef, Window
from auditor.correlate import NoKubeResolver
from auditor.engine import align_down, run_audit
from auditor.sources.replay import ReplaySource
from auditor.store import Store
from auditor.traces import TraceJob, load_trace, make_gpus
from counting import CountingStore

END = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
START = END - timedelta(hours=1)
W = timedelta(minutes=5)


def source() -> ReplaySource:
    tr = load_trace("h200-demo-cluster")
    jobs = [
        TraceJob(PodRef("a", "train-0"), make_gpus(2, "n2"), "resnet50_bf16_training"),
        TraceJob(PodRef("b", "short"), make_gpus(1, "n3"), "resnet50_bf16_training", duration=timedelta(minutes=22),
                 end_offset=timedelta(minutes=27)),
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
        out.append(({s["job"]: s for s in res.summaries}, counting.read))
        start = align_down(end, W)
    return out


def comparable(s: dict) -> dict:
    return {k: v for k, v in s.items() if k not in ("window", "computed_at")}


ENDS = [START + timedelta(minutes=m, seconds=13) for m in (7, 19, 20, 31, 44, 52)] + [END]


def test_cycles_equal_one_audit_of_the_whole_history_without_reading_it_again(store_url: str) -> None:
    whole = {s["job"]: s for s in run_audit(source(), NoKubeResolver("c1"), None, Window(START, END), now=END).summaries}
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
    whole = {s["job"]: s for s in run_audit(source(), NoKubeResolver("c1"), None, Window(START, END), now=END).summaries}
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
            conn.execute(sa.text("UPDATE job_aggregates SET state = :s WHERE job_id = :j"), {"s": b"{not json", "j": spin_id})
        assert store.aggregate(spin_id) is None
        start = align_down(ENDS[2], W)
        counting = CountingStore(store)
        res = run_audit(source(), NoKubeResolver("c1"), counting, Window(start, END), now=END, cumulative=True)
        assert counting.read > 0  # rebuilt from the stored buckets
        got = {s["job"]: s for s in res.summaries}
        for job in ("Pod/train-0", "Pod/spin"):
            assert comparable(got[job]) == comparable(whole[job]), job
        assert store.aggregate(spin_id) is not None
