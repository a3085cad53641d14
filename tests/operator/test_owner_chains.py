"""Owner resolution for JobSet, LeaderWorkerSet and RayJob chains on the test bed's real CRDs
(issue 14, item 2): each GPU pod resolves to the chain's top object, and a queued JobSet to the
Workload the real Kueue made for it.

No JobSet, LWS or KubeRay controller runs in the bed, so the test creates each level the way those
controllers do, with controller ``ownerReferences``: JobSet → Job → Pod; LeaderWorkerSet → leader
StatefulSet → leader Pod → worker StatefulSet → worker Pod; RayJob → RayCluster → Pod.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from kubeobjects import create, create_pod, owner_ref, pod_template
from kueue_objects import job_workload, kueue_running

from auditor.kube.client import KubeConfig, api_client
from auditor.kube.resolver import KubeResolver

pytestmark = pytest.mark.testbed

CONTAINER = {"name": "main", "image": "example.invalid/train:1"}


def _owned(obj: dict, body: dict) -> dict:
    body.setdefault("metadata", {})["ownerReferences"] = [owner_ref(obj)]
    return body


def _statefulset(name: str, owner: dict, labels: dict) -> dict:
    return _owned(
        owner,
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "serviceName": name,
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [CONTAINER]}},
            },
        },
    )


def test_jobset_lws_and_rayjob_pods_resolve_to_their_top_owner(testbed, kube_admin, namespace):
    api, ns, case = kube_admin, namespace, f"oc{uuid.uuid4().hex[:8]}"
    started = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=5)

    # JobSet → Job → Pod, queued: Kueue's JobSet integration suspends it and makes its Workload
    js = create(
        api,
        "jobset.x-k8s.io/v1alpha2",
        "jobsets",
        ns,
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "pretrain", "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "workers",
                        "replicas": 1,
                        "template": {"spec": {"parallelism": 1, "completions": 1, "template": pod_template(1)}},
                    }
                ]
            },
        },
    )
    js_job = create(
        api,
        "batch/v1",
        "jobs",
        ns,
        _owned(
            js,
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "pretrain-workers-0", "labels": {"jobset.sigs.k8s.io/jobset-name": "pretrain"}},
                "spec": {"suspend": True, "template": pod_template(1)},
            },
        ),
    )
    create_pod(api, ns, "pretrain-workers-0-0-abcde", gpus=1, owner=js_job, started=started)

    # LeaderWorkerSet → leader StatefulSet → leader Pod → worker StatefulSet → worker Pod
    lws = create(
        api,
        "leaderworkerset.x-k8s.io/v1",
        "leaderworkersets",
        ns,
        {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {"name": "serve"},
            "spec": {
                "replicas": 1,
                "leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": {"containers": [CONTAINER]}}},
            },
        },
    )
    leader_sts = create(
        api, "apps/v1", "statefulsets", ns, _statefulset("serve", lws, {"lws": "serve", "role": "leader"})
    )
    leader = create_pod(api, ns, "serve-0", gpus=1, owner=leader_sts, started=started)
    worker_sts = create(
        api, "apps/v1", "statefulsets", ns, _statefulset("serve-0", leader, {"lws": "serve", "role": "worker"})
    )
    create_pod(api, ns, "serve-0-1", gpus=1, owner=worker_sts, started=started)

    # RayJob → RayCluster → Pod
    head = {"rayStartParams": {}, "template": {"spec": {"containers": [CONTAINER]}}}
    rayjob = create(
        api,
        "ray.io/v1",
        "rayjobs",
        ns,
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "metadata": {"name": "tune"},
            "spec": {"entrypoint": "python tune.py", "rayClusterSpec": {"headGroupSpec": head}},
        },
    )
    cluster = create(
        api,
        "ray.io/v1",
        "rayclusters",
        ns,
        _owned(
            rayjob,
            {
                "apiVersion": "ray.io/v1",
                "kind": "RayCluster",
                "metadata": {"name": "tune-raycluster-x7k2p"},
                "spec": {"headGroupSpec": head},
            },
        ),
    )
    create_pod(api, ns, "tune-raycluster-x7k2p-head-q9z", gpus=1, owner=cluster, started=started)

    workload = job_workload(api, ns, js, timeout=30) if kueue_running() else None
    resolver = KubeResolver(api_client(KubeConfig(kubeconfig=testbed.kubeconfig)), cluster=case).start()
    try:
        assert resolver.wait_synced(60.0)
        deadline = time.monotonic() + 30
        while True:  # the pod informer may lag the creates by a moment
            jobs = {k: v for k, v in resolver.jobs().items() if k.startswith(f"{case}/{ns}/")}
            if sum(len(j.pods) for j in jobs.values()) == 4:
                break
            assert time.monotonic() < deadline, sorted(jobs)
            time.sleep(0.2)
    finally:
        resolver.stop()

    by_kind = {j.ref.kind: j for j in jobs.values()}
    assert set(by_kind) == {"JobSet", "LeaderWorkerSet", "RayJob"}, sorted(jobs)
    assert (by_kind["JobSet"].ref.name, by_kind["JobSet"].ref.uid) == ("pretrain", js["metadata"]["uid"])
    assert by_kind["JobSet"].uids == [js["metadata"]["uid"], js_job["metadata"]["uid"]]
    assert [p.name for p in by_kind["JobSet"].pods] == ["pretrain-workers-0-0-abcde"]
    assert by_kind["JobSet"].local_queue == "lq"
    if workload is not None:
        assert workload["metadata"]["ownerReferences"][0]["uid"] == js["metadata"]["uid"]
        assert by_kind["JobSet"].workload == workload["metadata"]["name"]
    lws_job = by_kind["LeaderWorkerSet"]
    assert (lws_job.ref.name, lws_job.ref.uid) == ("serve", lws["metadata"]["uid"])
    assert sorted(p.name for p in lws_job.pods) == ["serve-0", "serve-0-1"]
    assert lws_job.gpus == 2
    ray = by_kind["RayJob"]
    assert (ray.ref.name, ray.ref.uid) == ("tune", rayjob["metadata"]["uid"])
    assert ray.uids == [rayjob["metadata"]["uid"], cluster["metadata"]["uid"]]
