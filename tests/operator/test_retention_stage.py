"""The operator's hourly store retention (issue 12, items 4 and 11): its cluster only, as the
leader, never in a dry run, on an apscheduler job. No servers needed beyond a SQLite file; the
operator's clock is fixed, so what is pruned never depends on the day."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

from apscheduler.schedulers.background import BackgroundScheduler
from kubernetes import client as k8s
from operator_settings import operator_settings

from auditor.core.metrics import Metric
from auditor.core.model import Bucket, GpuId, JobRef, PodRef
from auditor.operator_loop import Operator
from auditor.operator_loop.retention import EVERY, FIRST_AFTER, JOB_ID
from auditor.store import Store

NOW = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
OLD = NOW - timedelta(days=50)


def _operator(tmp_path, *, dry_run: bool = False) -> tuple[Operator, Store]:
    url = f"sqlite:///{tmp_path}/store.db"
    settings = operator_settings(
        tmp_path,
        cluster="east",
        store={"url": url, "retention": {"buckets": "35d", "summaries": "400d"}},
        prometheus={"url": "http://127.0.0.1:9"},
    )
    store = Store.open(url)
    return Operator(settings, store=store, api=k8s.ApiClient(), clock=lambda: NOW, dry_run=dry_run), store


def _old_bucket(store: Store, cluster: str) -> int:
    jid = store.upsert_job(JobRef(cluster, "ml", "Job", "train"), OLD - timedelta(hours=1), OLD)
    store.replace_buckets(
        jid,
        [
            Bucket(
                PodRef("ml", "train-0"),
                GpuId("GPU-0"),
                Metric.SM_ACTIVE,
                OLD,
                OLD + timedelta(minutes=5),
                1.0,
                4,
                0.2,
                0.3,
            )
        ],
    )
    return jid


def test_the_operator_prunes_its_own_cluster_at_its_clock(tmp_path) -> None:
    op, store = _operator(tmp_path)
    try:
        east, west = _old_bucket(store, "east"), _old_bucket(store, "west")
        result = op.prune()
        assert result is not None and result.cluster == "east" and result.now == NOW
        assert result.deleted["gpu_buckets"] == 1 and result.deleted["gpu_pod_owners"] == 1 and result.total == 2
        assert store.buckets(east) == [] and len(store.buckets(west)) == 1
    finally:
        store.close()


def test_a_dry_run_operator_prunes_nothing(tmp_path) -> None:
    op, store = _operator(tmp_path, dry_run=True)
    try:
        jid = _old_bucket(store, "east")
        assert op.prune() is None
        assert len(store.buckets(jid)) == 1
    finally:
        store.close()


def test_the_job_is_registered_hourly_and_runs_in_the_scheduler(tmp_path) -> None:
    op, store = _operator(tmp_path)
    jid = _old_bucket(store, "east")
    ran = threading.Event()
    results = []

    def job() -> None:
        results.append(op.prune())
        ran.set()

    scheduler = BackgroundScheduler(timezone=timezone.utc)
    # a start FIRST_AFTER ago: the first run is due at once
    op.retention.schedule(scheduler, job, start=datetime.now(timezone.utc) - FIRST_AFTER)
    scheduler.start()
    try:
        assert ran.wait(30), "the retention job never ran"
        registered = scheduler.get_job(JOB_ID)
        assert registered.trigger.interval == EVERY == timedelta(hours=1)
        assert results[0].deleted["gpu_buckets"] == 1 and store.buckets(jid) == []
    finally:
        scheduler.shutdown(wait=True)
        store.close()
