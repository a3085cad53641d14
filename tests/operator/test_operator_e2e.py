"""Issue 4's Done-when against the test bed's real apiserver, Prometheus and PostgreSQL.

A namespace with a GPU node and a mix of workloads — a batch Job with 2 pods × 4 GPUs, a
Deployment (through its ReplicaSet), a PyTorchJob, a Kueue-managed Job with its Workload and
LocalQueue, a CPU-only pod and a Job that ends between cycles — and an hour of real H200 trace
history backfilled for their pods. ``gpu-auditor run --once`` runs as the chart's
ServiceAccount (impersonated, bound to exactly the rules of auditor/permissions.yaml).
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from kubeobjects import batch_job, create, create_pod, iso, owner_ref, set_pod_status
from kueue_objects import job_workload

from auditor import traces
from auditor.cli.main import main
from auditor.core.model import PodRef
from auditor.kube.client import call_json, resource_path
from auditor.store import Store

pytestmark = pytest.mark.testbed

INTERVAL = timedelta(seconds=15)
TARGET = timedelta(minutes=60)
PERMISSIONS = Path(__file__).resolve().parents[2] / "auditor" / "permissions.yaml"


def _whole(trace: traces.Trace, phase: str) -> timedelta:
    cycle = len(trace.steady(phase)) * INTERVAL
    return cycle * math.ceil(TARGET / cycle)


def _tag(text: str, case: str) -> str:
    return re.sub(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{", rf'\1{{case="{case}",', text, flags=re.M)


def grant_chart_permissions(api, namespace: str, sa: str, lease: str, features: set[str]) -> list[str]:
    """Create the ServiceAccount and the RBAC the chart renders from auditor/permissions.yaml
    (enabled features only; ``resourceNamesFrom: leaseName`` → the Lease). Returns the
    cluster-scoped object paths to delete afterwards."""
    perms = yaml.safe_load(PERMISSIONS.read_text())["features"]
    create(api, "v1", "serviceaccounts", namespace, {"metadata": {"name": sa}})
    cluster_rules, ns_rules = [], []
    for name, feat in perms.items():
        if feat["enabledBy"] != "always" and name not in features:
            continue
        for rule in feat["rules"]:
            r = {k: v for k, v in rule.items() if k != "resourceNamesFrom"}
            src = rule.get("resourceNamesFrom")
            if src == "leaseName":
                r["resourceNames"] = [lease]
            elif src == "secretNames":
                continue  # no Secrets referenced: the chart drops the rule
            (cluster_rules if feat["scope"] == "cluster" else ns_rules).append(r)
    cr_name = f"{namespace}-{sa}"
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]
    rbac = "rbac.authorization.k8s.io/v1"
    create(api, rbac, "clusterroles", None, {"metadata": {"name": cr_name}, "rules": cluster_rules})
    create(
        api,
        rbac,
        "clusterrolebindings",
        None,
        {
            "metadata": {"name": cr_name},
            "subjects": subject,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cr_name},
        },
    )
    create(api, rbac, "roles", namespace, {"metadata": {"name": sa}, "rules": ns_rules})
    create(
        api,
        rbac,
        "rolebindings",
        namespace,
        {
            "metadata": {"name": sa},
            "subjects": subject,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
        },
    )
    return [
        resource_path(rbac, "clusterrolebindings", None, cr_name),
        resource_path(rbac, "clusterroles", None, cr_name),
    ]


def _delete(api, paths: list[str]) -> None:
    for p in paths:
        try:
            call_json(api, p, method="DELETE")
        except Exception:  # noqa: BLE001 - best-effort cleanup of shared cluster objects
            pass


@pytest.fixture
def cluster_objects(kube_admin):
    paths: list[str] = []
    yield paths
    _delete(kube_admin, paths)


def _run_once(cfg: Path, capsys, *, undelivered: str | None = None) -> list[dict]:
    """One ``run --once``; with ``undelivered`` an alert had nowhere to go: exit 1 with that said."""
    rc = main(["run", "--once", "--output", "json", "--config", str(cfg)])
    out = capsys.readouterr()
    if undelivered is None:
        assert rc == 0, out.err
    else:
        assert rc == 1 and f"notify not delivered: no destination for team {undelivered}" in out.err, out.err
    return json.loads(out.out)


def test_run_once_mixed_workloads(
    testbed, kube_admin, namespace, prometheus, postgres_url, cluster_objects, tmp_path, capsys, caplog
):
    api, ns = kube_admin, namespace
    case = f"op{uuid.uuid4().hex[:10]}"
    node = f"{case}-gpu-node"
    demo = traces.load_trace("h200-demo-cluster")
    end = datetime.fromtimestamp(int(time.time()) // 300 * 300 - 2 * 3600, timezone.utc)

    # --- a GPU node, the namespace's team label, Kueue queues
    cluster_objects.append(resource_path("v1", "nodes", None, node))
    create(api, "v1", "nodes", None, {"metadata": {"name": node, "labels": {"nvidia.com/gpu.present": "true"}}})
    call_json(
        api,
        resource_path("v1", "nodes", None, node) + "/status",
        method="PATCH",
        body={
            "status": {
                "capacity": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "1Ti", "pods": "110"},
                "allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "1Ti", "pods": "110"},
            }
        },
        content_type="application/merge-patch+json",
    )
    call_json(
        api,
        resource_path("v1", "namespaces", None, ns),
        method="PATCH",
        body={"metadata": {"labels": {"team": "research"}}},
        content_type="application/merge-patch+json",
    )
    cq = f"cq-{case}"
    kv = "kueue.x-k8s.io/v1beta2"
    create(
        api,
        kv,
        "localqueues",
        ns,
        {"apiVersion": kv, "kind": "LocalQueue", "metadata": {"name": "lq"}, "spec": {"clusterQueue": cq}},
    )

    phases = {}  # pod name → (phase, gpus)

    def pods_for(owner, names, gpus, phase, labels=None):
        for n in names:
            started = end - _whole(demo, phase)
            create_pod(api, ns, n, gpus=gpus, owner=owner, labels=labels, node=node, started=started)
            phases[n] = (phase, gpus)

    # 1. batch Job, 2 pods x 4 GPUs, team from the pod label
    train = batch_job(api, ns, "train")
    pods_for(train, ["train-0-abcde", "train-1-fghij"], 4, "resnet50_bf16_training", {"team": "vision"})
    # 2. Deployment → ReplicaSet → pod, team from the Deployment's label
    dep = create(
        api,
        "apps/v1",
        "deployments",
        ns,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "serve", "labels": {"team": "inference"}},
            "spec": {
                "selector": {"matchLabels": {"app": "serve"}},
                "template": {
                    "metadata": {"labels": {"app": "serve"}},
                    "spec": {"containers": [{"name": "main", "image": "x"}]},
                },
            },
        },
    )
    rs = create(
        api,
        "apps/v1",
        "replicasets",
        ns,
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "serve-7d9f", "labels": {"app": "serve"}, "ownerReferences": [owner_ref(dep)]},
            "spec": {
                "selector": {"matchLabels": {"app": "serve"}},
                "template": {
                    "metadata": {"labels": {"app": "serve"}},
                    "spec": {"containers": [{"name": "main", "image": "x"}]},
                },
            },
        },
    )
    pods_for(rs, ["serve-7d9f-x1"], 1, "notebook_idle_model_loaded", {"app": "serve"})
    # 3. PyTorchJob with a master and a worker, 2 GPUs each; team from the namespace label
    ptj = create(
        api,
        "kubeflow.org/v1",
        "pytorchjobs",
        ns,
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "ptj"},
            "spec": {
                "pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "template": {"spec": {"containers": [{"name": "pytorch", "image": "x"}]}}}
                }
            },
        },
    )
    pods_for(ptj, ["ptj-master-0", "ptj-worker-0"], 2, "kernel_spin_waiting_4_blocks")
    # 4. Kueue-managed Job with its Workload (made by Kueue; its LocalQueue names the ClusterQueue): team from the queue
    queued = batch_job(api, ns, "queued", labels={"kueue.x-k8s.io/queue-name": "lq"})
    wl = job_workload(api, ns, queued)  # Kueue's own, owned by the Job
    assert wl["metadata"]["name"].startswith("job-queued-")
    pods_for(queued, ["queued-0-zzzzz"], 2, "embedding_gather")
    # 5. a Job that ends between cycles
    done = batch_job(api, ns, "done")
    pods_for(done, ["done-0-qqqqq"], 1, "llm_batched_inference_bf16", {"team": "vision"})
    # 6. a CPU-only pod (no GPU, no DCGM series)
    create_pod(api, ns, "cpu-only", gpus=0, node=node, started=end - timedelta(hours=1))

    # --- DCGM history for every GPU pod
    jobs = [
        traces.TraceJob(
            PodRef(ns, name, "main"), traces.make_gpus(int(g), f"{node}-{i}"), phase, duration=_whole(demo, phase)
        )
        for i, (name, (phase, g)) in enumerate(sorted(phases.items()))
    ]
    text = traces.trace_to_openmetrics(demo, jobs, end=end, duration=max(j.duration for j in jobs), interval=INTERVAL)
    prometheus.backfill(_tag(text, case))

    # --- the operator's identity: the chart's ServiceAccount, nothing more
    sa, lease = "gpu-auditor", f"lease-{case}"
    cluster_objects.extend(grant_chart_permissions(api, ns, sa, lease, {"kueueRead"}))
    cfg = tmp_path / "settings.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "cluster": "test",
                "log_level": "info",
                "kubernetes": {"kubeconfig": testbed.kubeconfig, "impersonate": f"system:serviceaccount:{ns}:{sa}"},
                "prometheus": {"url": prometheus.url, "matchers": {"case": case}, "label_convention": "pod"},
                "store": {"url": postgres_url},
                "interval": "5m",
                "bucket_width": "5m",
                "leader_election": {
                    "namespace": ns,
                    "lease_name": lease,
                    "lease_duration": "6s",
                    "renew_deadline": "4s",
                    "retry_period": "1s",
                },
                "features": {"annotate": False, "events": False, "kueue": True, "requeue": False},
                "team_sources": ["podLabel:team", "jobLabel:team", "kueueQueue", "namespaceLabel:team", "namespace"],
                "http": {"port": 0},
            }
        )
    )

    caplog.set_level(logging.INFO)
    # the PyTorchJob's 4 GPUs all spin on a few SMs with no math, DRAM or power: the shipped
    # hung-job policy (issue 33) alerts its team at once, which has no route in this installation
    out = _run_once(cfg, capsys, undelivered="research")
    by_job = {s["job"]: s for s in out}
    assert set(by_job) == {"Job/train", "Deployment/serve", "PyTorchJob/ptj", "Job/queued", "Job/done"}, sorted(by_job)
    expect = {
        "Job/train": ("vision", 8, "healthy"),
        "Deployment/serve": ("inference", 1, "idle"),
        "PyTorchJob/ptj": ("research", 4, "low_sm_efficiency"),
        "Job/queued": (cq, 2, "memory_bound"),
        "Job/done": ("vision", 1, "healthy"),
    }
    for job, (team, gpus, verdict) in expect.items():
        s = by_job[job]
        assert (s["team"], s["gpus"], s["verdict"]) == (team, gpus, verdict), (
            job,
            s["team"],
            s["gpus"],
            s["verdict"],
            s["findings"],
        )
        assert s["namespace"] == ns and s["cluster"] == "test" and s["final"] is False
    assert by_job["Job/train"]["uid"] == train["metadata"]["uid"]
    assert len(by_job["Job/train"]["kube"]["pods"]) == 2
    assert by_job["Job/queued"]["kube"]["workload"] == wl["metadata"]["name"]
    assert by_job["Job/queued"]["kube"]["cluster_queue"] == cq
    assert by_job["Job/queued"]["queue"] == "lq"
    assert not [r for r in caplog.records if "Forbidden" in r.getMessage()]

    with Store.open(postgres_url) as store:
        stored = {s["job"]: s for s in store.summaries(cluster="test")}
        assert set(stored) == set(expect)
        assert stored["Job/train"]["verdict"] == "healthy"

    # --- the Job "done" finishes, the PyTorchJob is deleted (its pods go): next cycle, final summaries
    set_pod_status(
        api,
        ns,
        "done-0-qqqqq",
        phase="Succeeded",
        started=end - _whole(demo, "llm_batched_inference_bf16"),
        finished=end,
    )
    for p in ("ptj-master-0", "ptj-worker-0"):
        call_json(api, resource_path("v1", "pods", ns, p), method="DELETE", query=[("gracePeriodSeconds", 0)])
    # the ladder's next step notifies the PyTorchJob's team, which has no route in this installation
    out2 = _run_once(cfg, capsys, undelivered="research")
    finals = {s["job"]: s for s in out2 if s.get("final")}
    assert set(finals) == {"Job/done", "PyTorchJob/ptj"}, [(s["job"], s.get("final")) for s in out2]
    assert finals["Job/done"]["ended"] == iso(end)
    assert finals["Job/done"]["verdict"] == "healthy" and finals["Job/done"]["gpus"] == 1
    with Store.open(postgres_url) as store:
        open_keys = {ref.job for _id, ref, _f, _l in store.open_jobs("test")}
        assert open_keys == {"Job/train", "Deployment/serve", "Job/queued"}
        stored = {s["job"]: s for s in store.summaries(cluster="test")}
        assert stored["Job/done"]["final"] is True and stored["PyTorchJob/ptj"]["final"] is True
        runs = [r for r in store.runs() if (r["detail"] or {}).get("origin") == "operator"]
        assert len(runs) >= 2 and all(r["status"].startswith("ok") for r in runs)
        # the second cycle started where the first ended (aligned down), not at the jobs' start
        assert runs[0]["window_start"] >= runs[1]["window_end"] - timedelta(minutes=5)

    # --- a third cycle finalizes nothing again
    out3 = _run_once(cfg, capsys)
    assert not [s for s in out3 if s.get("final")]
