"""Two operator cycles 8 s apart over data that ended inside a bucket agree (issue 12, item 5).

The report: a job got 5.37, then 6.00 GPU-hours, "sample interval 60 s" for 15 s data, waste
5.07 → 5.67. Here the operator's own cycle runner (the Kubernetes API of the test bed resolves
the pods to their Job, Prometheus holds the samples, PostgreSQL the store) runs the two cycles.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from kubeobjects import batch_job, replayed_job_pods

from auditor.kube.client import KubeConfig, api_client
from auditor.kube.resolver import KubeResolver
from auditor.operator_loop.cycle import CycleRunner
from auditor.sources.prometheus import PrometheusSource
from auditor.store import Store

pytestmark = pytest.mark.testbed
INTERVAL = timedelta(seconds=15)


def test_two_cycles_8s_apart_after_the_data_ended_mid_bucket(
    testbed, kube_admin, namespace, prometheus, postgres_url
) -> None:
    case = f"ci{uuid.uuid4().hex[:8]}"
    # samples end 75 s into a bucket, two hours back (Prometheus's backfill wants the past)
    now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    end = now.replace(minute=now.minute // 5 * 5) - timedelta(hours=2) + timedelta(seconds=75)
    duration = timedelta(minutes=40)
    job = batch_job(kube_admin, namespace, "train", labels={"team": "research"})
    replayed_job_pods(
        kube_admin,
        prometheus,
        namespace,
        job,
        case=case,
        phase="resnet50_bf16_training",
        end=end,
        duration=duration,
        interval=INTERVAL,
        labels={"team": "research"},
    )

    resolver = KubeResolver(api_client(KubeConfig(kubeconfig=testbed.kubeconfig)), cluster=case).start()
    try:
        assert resolver.wait_synced(60.0)
        with Store.open(postgres_url) as store:
            runner = CycleRunner(
                store=store,
                source=PrometheusSource(prometheus.url, matchers={"case": case}),
                resolver=resolver,
                cluster=case,
            )
            now1 = end + timedelta(seconds=100)
            first = {s.job: s.to_json() for s in runner.run(now1).summaries}["Job/train"]
            second_run = runner.run(now1 + timedelta(seconds=8))
            second = {s.job: s.to_json() for s in second_run.summaries}.get("Job/train") or store.summary(
                store.find_job(namespace, "Job", "train", case)[0]
            )
    finally:
        resolver.stop()
    assert first["scrape_interval_s"] == 15.0
    assert first["gpu_hours"] == pytest.approx(8 * duration.total_seconds() / 3600, rel=0.01)
    same = lambda s: {k: v for k, v in s.items() if k not in ("window", "computed_at")}  # noqa: E731
    assert same(second) == same(first)
