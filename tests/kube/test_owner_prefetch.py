"""The first sighting of many jobs costs a paged list per owner kind, not a GET per job (issue 18):
on the test bed's real apiserver, 12 Jobs (two of them under one CronJob) with a GPU pod each
resolve to their top owners with the Jobs read in one metadata list (pages of 500 across the
cluster) and the CronJob by one GET (too few of its kind for a list); a second view asks nothing.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from kubeobjects import batch_job, create, create_pod, owner_ref

from auditor.kube.client import KubeConfig, api_client, call_json, resource_path
from auditor.kube.owners import LIST_AT, PAGE
from auditor.kube.resolver import KubeResolver

pytestmark = pytest.mark.testbed

JOBS = 12


def test_many_new_jobs_are_read_with_one_list_of_their_kind(testbed, kube_admin, namespace):
    api, ns = kube_admin, namespace
    started = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=5)
    cron = create(
        api,
        "batch/v1",
        "cronjobs",
        ns,
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "nightly"},
            "spec": {
                "schedule": "0 0 * * *",
                "suspend": True,
                "jobTemplate": {
                    "spec": {
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "containers": [{"name": "main", "image": "example.invalid/x:1"}],
                            }
                        }
                    }
                },
            },
        },
    )
    jobs = []
    for i in range(JOBS):
        job = batch_job(api, ns, f"train-{i:02d}", suspend=True)
        if i < 2:  # the CronJob's runs: its ownerReference added as its controller would
            job = call_json(
                api,
                resource_path("batch/v1", "jobs", ns, job["metadata"]["name"]),
                method="PATCH",
                body={"metadata": {"ownerReferences": [owner_ref(cron)]}},
                content_type="application/merge-patch+json",
            )
        jobs.append(job)
        create_pod(api, ns, f"train-{i:02d}-0", gpus=1, owner=job, started=started)
    assert JOBS >= LIST_AT
    all_jobs = len(call_json(api, resource_path("batch/v1", "jobs"))["items"])

    resolver = KubeResolver(api_client(KubeConfig(kubeconfig=testbed.kubeconfig)), cluster="prefetch").start()
    try:
        assert resolver.wait_synced(60.0)
        deadline = time.monotonic() + 30
        while sum(k.startswith(f"{ns}/") for k in resolver.pods.items()) < JOBS:  # the informer may lag
            assert time.monotonic() < deadline
            time.sleep(0.2)
        # other tests' pods share the cluster: count only what this namespace's owners cost
        gets: list[tuple[str, str]] = []
        lists: list[str] = []
        owners = resolver._owners
        fetch, list_kind = owners._fetch, owners._list
        owners._fetch = lambda n, ref, plural: (gets.append((n, ref.kind)), fetch(n, ref, plural))[1]  # type: ignore[method-assign]
        owners._list = lambda v, plural, refs: (lists.append(plural), list_kind(v, plural, refs))[1]  # type: ignore[method-assign]
        before = owners.requests
        view = {k: v for k, v in resolver.jobs().items() if k.startswith(f"prefetch/{ns}/")}
        first = owners.requests - before
        resolver.jobs()
        again = resolver.owner_requests
        resolver.jobs()
        assert resolver.owner_requests == again  # a steady view reads from the cache
    finally:
        resolver.stop()

    # the Jobs' list (its pages) and one GET of the CronJob, where a GET per owner made 13
    assert lists == ["jobs"], lists
    assert [g for g in gets if g[0] == ns] == [(ns, "CronJob")]
    assert first <= -(-all_jobs // PAGE) + len(gets) < JOBS, (first, all_jobs, gets)
    assert sorted(view) == sorted(
        [f"prefetch/{ns}/CronJob/nightly"] + [f"prefetch/{ns}/Job/train-{i:02d}" for i in range(2, JOBS)]
    )
    assert view[f"prefetch/{ns}/CronJob/nightly"].uids == [cron["metadata"]["uid"], jobs[0]["metadata"]["uid"]]
    assert [p.name for p in view[f"prefetch/{ns}/CronJob/nightly"].pods] == ["train-00-0", "train-01-0"]
    assert view[f"prefetch/{ns}/Job/train-05"].ref.uid == jobs[5]["metadata"]["uid"]
