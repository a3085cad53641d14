"""The operator's cycle keeps the jobs' aggregates and summaries between cycles (issue 18) and
still answers exactly what the store says.

A :class:`CycleRunner` keeps each job's aggregate after saving it, so a steady cycle does not
read and decode it again, and builds its result from the engine's own summaries instead of
reading every saved document back. The store stays the truth: here one runner runs every cycle
(keeping its copies) and, on a copy of the same store taken just before each cycle, a fresh
runner (nothing kept: what a restarted or new leader computes) runs the same cycle. Their
summaries and stored rows must be the same after an aggregate changed under the runner (another
writer) and after a cycle lost its lease and was rolled back. The real apiserver resolves the
pods, Prometheus holds the samples, the store is a SQLite file.
"""

from __future__ import annotations

import sqlite3
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from counting import CountingStore
from kubeobjects import batch_job, replayed_job_pods

from auditor.core.accumulate import JobAggregate
from auditor.core.job_summary import JobSummary
from auditor.kube.client import KubeConfig, api_client
from auditor.kube.resolver import KubeResolver
from auditor.operator_loop import cycle as cycle_module
from auditor.operator_loop.cycle import CycleRunner, LostLeadership
from auditor.sources.prometheus import PrometheusSource
from auditor.store import Store

pytestmark = pytest.mark.testbed
INTERVAL = timedelta(seconds=15)


def _copy(src: Path, dst: Path) -> None:
    dst.unlink(missing_ok=True)
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)


def _stored(store: Store) -> tuple[list[dict], list[tuple]]:
    """The summaries and each aggregate row's ``through`` (the state itself may be older: a kept
    one is written whole only every STATE_EVERY, and a reader folds the buckets after it)."""
    with store.reading("compare") as conn:
        aggs = [tuple(r) for r in conn.exec_driver_sql("SELECT job_id, through FROM job_aggregates ORDER BY job_id")]
    return store.summaries(), aggs


def _state_through(store: Store, job_id: int) -> datetime | None:
    """The ``through`` inside the stored state (what a reader folds on from)."""
    agg = store.aggregate(job_id)
    return agg.through if agg is not None else None


def test_kept_aggregates_and_summaries_match_a_fresh_runner(
    testbed, kube_admin, namespace, prometheus, tmp_path, monkeypatch
) -> None:
    # summaries are written two at a time here (of three jobs): the result must not depend on
    # whether a document was written, and slimmed, before the chunk ended
    monkeypatch.setattr(cycle_module, "_SUMMARY_GROUP", 2)
    case = f"ka{uuid.uuid4().hex[:8]}"
    now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    start = now.replace(minute=now.minute // 5 * 5) - timedelta(hours=3)
    end = start + timedelta(minutes=50)
    # train and tune share their node's GPUs (time-slicing); solo has a node of its own
    for name, node in (("train", 0), ("tune", 0), ("solo", 5)):
        job = batch_job(kube_admin, namespace, name, labels={"team": "research"})
        replayed_job_pods(
            kube_admin,
            prometheus,
            namespace,
            job,
            case=case,
            phase="resnet50_bf16_training",
            end=end,
            duration=end - start,
            interval=INTERVAL,
            pods=1,
            gpus=2,
            labels={"team": "research"},
            first_node=node,
        )
    main_db, fresh_db = tmp_path / "main.db", tmp_path / "fresh.db"
    resolver = KubeResolver(api_client(KubeConfig(kubeconfig=testbed.kubeconfig)), cluster=case).start()
    leader = [True]
    try:
        assert resolver.wait_synced(60.0)
        source = PrometheusSource(prometheus.url, matchers={"case": case})
        with Store.open(f"sqlite:///{main_db}") as real:
            store = CountingStore(real)
            runner = CycleRunner(
                store=store, source=source, resolver=resolver, cluster=case, still_leader=lambda: leader[0]
            )

            def cycle(at: datetime) -> list[dict]:
                """One cycle of the keeping runner, checked against a fresh one on a copy."""
                _copy(main_db, fresh_db)
                got = runner.run(at)
                with Store.open(f"sqlite:///{fresh_db}") as other:
                    want = CycleRunner(store=other, source=source, resolver=resolver, cluster=case).run(at)
                    assert [s.to_json() for s in got.summaries] == [s.to_json() for s in want.summaries]
                    assert _stored(real) == _stored(other)
                # the result is what was stored, as reading it back would give
                for s in got.summaries:
                    job_id, _ref = real.find_job(s.key.namespace, *s.job.split("/"), case)
                    assert JobSummary.from_json(real.summary(job_id)) == s
                return [s.to_json() for s in got.summaries]

            t = start + timedelta(minutes=20)
            first = cycle(t)  # first sighting: the aggregates are read (there are none) and built
            assert len(first) == 3
            reads = store.aggregate_reads
            ids = {name: real.find_job(namespace, "Job", name, case)[0] for name in ("train", "solo")}
            written = {name: _state_through(real, job_id) for name, job_id in ids.items()}
            cycle(t + timedelta(minutes=5))
            assert store.aggregate_reads == reads  # steady state: all kept, none read
            # solo's state stays as the first cycle wrote it, only the stored `through` moved (the
            # fresh runner above, folding the buckets after the state, summarized the same);
            # train's GPUs are shared, so its state is written whole every cycle
            assert written["solo"] is not None and _state_through(real, ids["solo"]) == written["solo"]
            assert (_state_through(real, ids["train"]) or t) > (written["train"] or t)
            moved = dict(_stored(real)[1])
            assert str(moved[ids["solo"]]) > str(written["solo"].replace(tzinfo=None))

            # another writer changes one job's aggregate (same `through`): the store's is used
            job_id, _ref = real.find_job(namespace, "Job", "train", case)
            agg = real.aggregate(job_id)
            assert agg is not None and agg.through is not None
            empty = JobAggregate()
            empty.freeze(agg.through)
            empty.interval = agg.interval
            real.save_aggregate(job_id, empty, t)
            before = {d["job"]: d["gpu_hours"] for d in first}
            reads = store.aggregate_reads
            third = {d["job"]: d["gpu_hours"] for d in cycle(t + timedelta(minutes=10))}
            assert store.aggregate_reads == reads + 1  # only the changed one
            assert third["Job/train"] < before["Job/train"]  # it summarizes what the store holds

            # a cycle that loses its lease is rolled back; the next one matches a fresh runner
            leader[0] = False
            with pytest.raises(LostLeadership):
                runner.run(t + timedelta(minutes=15))
            leader[0] = True
            cycle(t + timedelta(minutes=15))
            cycle(t + timedelta(minutes=20))
    finally:
        resolver.stop()
