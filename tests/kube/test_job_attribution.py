"""The resolver's pure attribution (auditor.kube.jobview) behind a fake owner lookup, no API
server: owner chains to the top owner, Workload matching by any uid of the chain, queues and
team sources in order. The informers and the owner cache are proven in tests/operator."""

from __future__ import annotations

from auditor.core.kinds import BY_GROUP_KIND, JOB_KINDS
from auditor.kube.jobview import OwnerMeta, OwnerRef, PodInfo, attribute, workload_index

JOB = OwnerRef("batch/v1", "Job", "train-1", "uid-job")
CRON = OwnerRef("batch/v1", "CronJob", "nightly", "uid-cron")
OWNERS = {
    "uid-job": OwnerMeta("batch/v1", "Job", "train-1", "uid-job", {"team": "vision"}, CRON, 0.0),
    "uid-cron": OwnerMeta("batch/v1", "CronJob", "nightly", "uid-cron", {}, None, 0.0),
}


def pod(name: str, owner: OwnerRef | None, labels: dict[str, str] | None = None) -> PodInfo:
    return PodInfo("ml", name, f"uid-{name}", labels or {}, owner, 1.0, "Running", "n1", None, None, None)


def lookup(namespace: str, ref: OwnerRef) -> OwnerMeta | None:
    return OWNERS.get(ref.uid)


def test_pods_group_under_the_top_of_their_chain_with_its_workload_queue_and_team() -> None:
    wl = {"name": "job-train-1", "queue": "lq", "cluster_queue": None, "uids": ["uid-job"]}
    jobs = attribute(
        [pod("p0", JOB), pod("p1", JOB), pod("bare", None, {"team": "infra"})],
        lookup,
        cluster="east",
        team_sources=["jobLabel:team", "podLabel:team", "kueueQueue", "namespace"],
        ns_labels={},
        wl_index=workload_index([wl]),
        lqs={"ml/lq": "cq-gpu"},
    )
    assert sorted(jobs) == ["east/ml/CronJob/nightly", "east/ml/Pod/bare"]
    top = jobs["east/ml/CronJob/nightly"]
    assert [p.name for p in top.pods] == ["p0", "p1"]
    assert top.uids == ["uid-cron", "uid-job"]  # top first
    assert (top.workload, top.local_queue, top.cluster_queue) == ("job-train-1", "lq", "cq-gpu")
    # the CronJob has no team label: podLabel has none either, so the queue names the team
    assert top.ref.team == "cq-gpu" and top.ref.queue == "lq" and top.ref.uid == "uid-cron"
    assert jobs["east/ml/Pod/bare"].ref.team == "infra"


def test_an_owner_that_cannot_be_read_is_itself_the_job() -> None:
    gone = OwnerRef("kubeflow.org/v1", "PyTorchJob", "pt", "uid-pt")
    (job,) = attribute(
        [pod("w0", gone)], lookup, cluster="c", team_sources=["namespace"], ns_labels={}, wl_index={}, lqs={}
    ).values()
    assert (job.ref.kind, job.ref.name, job.ref.team, job.uids) == ("PyTorchJob", "pt", "ml", ["uid-pt"])


def test_one_kinds_table_serves_reading_and_writing() -> None:
    assert {(k.group, k.kind) for k in JOB_KINDS.values()} == set(BY_GROUP_KIND)
    assert JOB_KINDS["JobSet"].path("ml", "js") == "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/js"
    assert JOB_KINDS["Pod"].path("ml") == "/api/v1/namespaces/ml/pods"
