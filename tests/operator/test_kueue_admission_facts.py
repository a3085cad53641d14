"""Kueue's admission facts in the store, from the operator's cycles on the bed's real Kueue (issue 14, item 4).

One GPU of real quota (ResourceFlavor → ClusterQueue → LocalQueue ``lq``) and two one-GPU Jobs:
``first`` is admitted at once, ``second`` waits behind it until ``first`` is requeued (our
requeue's ``spec.active: false``, then ``true``); ``first`` then waits behind ``second`` and is
re-admitted when ``second`` is requeued in turn. Each step is followed by an operator cycle
(the cycle runner with the Kubernetes resolver, Prometheus holding the pods' DCGM history, the
bed's PostgreSQL as store); then ``explain`` and the weekly report show what was stored.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pytest
from kubeobjects import replayed_job_pods
from kueue_objects import KV, gpu_job, gpu_quota, has_condition, job_workload, kueue_running

from auditor.cli.main import main
from auditor.kube.client import KubeConfig, api_client, call_json, resource_path
from auditor.kube.resolver import KubeResolver
from auditor.operator_loop.cycle import CycleRunner
from auditor.reports import IsoWeek, generate
from auditor.reports.aggregate import fmt
from auditor.reports.formats import to_markdown
from auditor.reports.html import render_html
from auditor.reports.service import ReportOptions
from auditor.reports.slack import team_message
from auditor.reports.weeks import zone
from auditor.sources.prometheus import PrometheusSource
from auditor.store import Store
from auditor.store.admissions import AdmissionStore

pytestmark = [
    pytest.mark.testbed,
    pytest.mark.skipif(not kueue_running(), reason="the bed runs without the Kueue controller"),
]
INTERVAL = timedelta(seconds=15)


def _until(what: str, pred: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


def _set_active(api: Any, ns: str, workload: str, active: bool) -> None:
    """Our requeue's patch (KubeActions.deactivate / reactivate write the same field)."""
    call_json(
        api,
        resource_path(KV, "workloads", ns, workload),
        method="PATCH",
        body={"spec": {"active": active}},
        content_type="application/merge-patch+json",
    )


def test_operator_records_queue_waits_evictions_and_requeues(
    testbed, kube_admin, namespace, prometheus, postgres_url, capsys
) -> None:
    api, ns = kube_admin, namespace
    case = f"kf{uuid.uuid4().hex[:8]}"
    # the pods' DCGM history lies two hours back (Prometheus's backfill wants the past); the
    # Workloads live now: the facts come from Kueue's times, the GPU figures from the samples
    wall = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    end = wall.replace(minute=wall.minute // 5 * 5) - timedelta(hours=2)
    now = end + timedelta(seconds=100)

    def wl_of(job: dict) -> str:
        return job_workload(api, ns, job)["metadata"]["name"]

    def wl(name: str) -> dict:
        return call_json(api, resource_path(KV, "workloads", ns, name))

    with gpu_quota(api, ns, gpus=1) as cq:
        first = gpu_job(api, ns, "first")
        w1 = wl_of(first)
        _until("first admitted", lambda: has_condition(wl(w1), "Admitted"))
        second = gpu_job(api, ns, "second")
        w2 = wl_of(second)
        _until("second pending", lambda: has_condition(wl(w2), "QuotaReserved", "False"))
        for job in (first, second):
            replayed_job_pods(
                api,
                prometheus,
                ns,
                job,
                case=case,
                phase="resnet50_bf16_training",
                end=end,
                duration=timedelta(minutes=20),
                interval=INTERVAL,
                pods=1,
                gpus=1,
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
                facts = AdmissionStore(store)

                def cycle(k: int) -> dict[str, Any]:
                    time.sleep(0.5)  # the informer catches up with the last Workload change
                    runner.run(now + timedelta(seconds=10 * k))
                    return {name: facts.facts(store.find_job(ns, "Job", name, case)[0]) for name in ("first", "second")}

                # 1. first admitted through the ClusterQueue at once; second waits (quota short)
                time.sleep(2.0)  # Kueue's condition times have one-second resolution
                f = cycle(0)
                assert f["first"].cluster_queue == cq and f["first"].local_queue == "lq"
                assert f["first"].queue_wait_s is not None and f["first"].queue_wait_s <= 1.0
                assert f["first"].eviction_count == 0 and f["first"].requeues == 0 and not f["first"].pending
                assert f["second"].pending and f["second"].admitted_at is None

                # 2. our requeue of first: Kueue evicts it, admits second, and queues first again
                _set_active(api, ns, w1, False)
                _until("second admitted", lambda: has_condition(wl(w2), "Admitted"))
                _set_active(api, ns, w1, True)
                _until("first requeued", lambda: has_condition(wl(w1), "Requeued"))
                f = cycle(1)
                s2 = f["second"]
                assert s2.cluster_queue == cq and not s2.pending
                assert s2.queue_wait_s is not None and s2.queue_wait_s >= 2.0 > f["first"].queue_wait_s
                assert s2.admitted_at is not None and s2.admitted_at > f["first"].admitted_at
                f1 = f["first"]
                assert f1.evictions == {"Deactivated": 1} and f1.requeues == 1 and f1.pending
                assert f1.last_eviction_reason == "Deactivated" and f1.last_evicted_at is not None
                assert f1.cluster_queue == cq  # kept while status.admission is cleared

                # 3. second requeued in turn: first is re-admitted, its first admission kept
                time.sleep(1.0)
                _set_active(api, ns, w2, False)
                _until("first re-admitted", lambda: has_condition(wl(w1), "Admitted"))
                f = cycle(2)
                f1 = f["first"]
                assert not f1.pending and f1.requeues == 1 and f1.eviction_count == 1
                assert f1.admitted_at is not None and f1.last_admitted_at is not None
                assert f1.last_admitted_at > f1.admitted_at and f1.last_wait_s is not None and f1.last_wait_s >= 1.0
                assert f["second"].evictions == {"Deactivated": 1} and f["second"].pending
                assert f["second"].queue_wait_s == s2.queue_wait_s  # the first admission's wait stays
                waits = (f["first"].queue_wait_s, s2.queue_wait_s)
                # the weekly report: the team's queue wait next to its efficiency
                week = IsoWeek.containing(f["first"].admitted_at, zone("UTC"))
                same_week = IsoWeek.containing(s2.admitted_at, zone("UTC")) == week
                report = generate(store, week, now=now, options=ReportOptions(cluster=case))
        finally:
            resolver.stop()

    (team,) = [t for t in report["teams"] if t["jobs"] or t["admitted_jobs"]]
    if same_week:  # both first admitted in this ISO week (always, unless the test ran across Monday 00:00 UTC)
        assert team["admitted_jobs"] == 2 and report["total"]["admitted_jobs"] == 2
        assert team["queue_wait_median_s"] == pytest.approx((waits[0] + waits[1]) / 2)
        assert team["queue_wait_p90_s"] == pytest.approx(waits[0] + 0.9 * (waits[1] - waits[0]))
    md = to_markdown(report)
    assert f"- **queue wait median**: {fmt('wait', report['total']['queue_wait_median_s'])}" in md
    html = render_html(report)
    assert 'data-k="queue_wait_median_s"' in html and "queue wait p90" in html
    _text, blocks = team_message(report, team)
    assert any("Queue wait median · p90" in f["text"] for b in blocks for f in b.get("fields", []))

    # explain shows them, as text and as JSON
    assert main(["explain", f"{ns}/Job/first", "--db", postgres_url, "--cluster", case]) == 0
    text = capsys.readouterr().out
    assert f"kueue: ClusterQueue {cq} (LocalQueue lq)" in text
    assert "evictions 1 (Deactivated 1)   requeues 1   re-admitted after" in text
    assert main(["explain", f"{ns}/Job/second", "--db", postgres_url, "--cluster", case, "--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)["admission"]
    assert doc["cluster_queue"] == cq and doc["queue_wait_s"] == waits[1] and doc["pending"] is True
    with capsys.disabled():
        print(f"\nkueue queue waits (s): first {waits[0]}, second (behind first) {waits[1]}")


def test_audit_with_the_kubernetes_api_records_them(
    testbed, kube_admin, namespace, prometheus, tmp_path, capsys
) -> None:
    api, ns = kube_admin, namespace
    case = f"ka{uuid.uuid4().hex[:8]}"
    wall = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    end = wall.replace(minute=wall.minute // 5 * 5) - timedelta(hours=2)
    db = f"sqlite:///{tmp_path}/s.db"
    with gpu_quota(api, ns, gpus=1) as cq:
        job = gpu_job(api, ns, "train")
        w = job_workload(api, ns, job)["metadata"]["name"]
        _until("admitted", lambda: has_condition(call_json(api, resource_path(KV, "workloads", ns, w)), "Admitted"))
        replayed_job_pods(
            api,
            prometheus,
            ns,
            job,
            case=case,
            phase="resnet50_bf16_training",
            end=end,
            duration=timedelta(minutes=20),
            interval=INTERVAL,
            pods=1,
            gpus=1,
        )
        argv = ["audit", "--prometheus", prometheus.url, "--kubeconfig", testbed.kubeconfig, "--match", f"case={case}"]
        window = ["--start", (end - timedelta(minutes=25)).isoformat(), "--end", end.isoformat()]
        assert main([*argv, *window, "--db", db, "--cluster", case, "--output", "json"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    with Store.open(db) as store:
        job_id, _ref = store.find_job(ns, "Job", "train", case) or (None, None)
        assert job_id is not None
        facts = AdmissionStore(store).facts(job_id)
    assert facts is not None and facts.cluster_queue == cq and facts.workload == w
    assert facts.queue_wait_s is not None and facts.eviction_count == 0
