"""The chart's ServiceAccount has exactly the Kueue permissions its Kueue features use, proven on
the test bed's real Kueue (v0.17.0) through real quota, with requeue off and on.

The operator's own code runs as the ServiceAccount (impersonated, RBAC and the write fence in the
path): the resolver lists and watches Workloads and LocalQueues and attributes the job to its
LocalQueue and ClusterQueue; the requeue finds the Workload, reads whether it still holds quota
(the backoff's quota-release check), deactivates it with a lowered priority boost and reactivates
it, and Kueue really evicts and re-admits it. Everything else in the Kueue API is denied: creating,
deleting, updating Workloads or their status, any ClusterQueue read or write, LocalQueue writes,
priority classes, flavors; and, with requeue off, every Workload patch.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any, Callable

import pytest
from chartlib import CHART, Chart, ServiceAccount, drop_release
from kueue_objects import (
    KV,
    gpu_job,
    gpu_quota,
    has_condition,
    job_controller_starts,
    job_controller_stops,
    job_workload,
    kueue_running,
)

from auditor.actions.kube import KUEUE_PRIORITY_BOOST, KubeActions
from auditor.core.action_target import ActionTarget
from auditor.core.identity import JobKey
from auditor.errors import PermanentError
from auditor.kube.client import KubeConfig, api_client, call_json, resource_path
from auditor.kube.resolver import KubeResolver

pytestmark = [
    pytest.mark.testbed,
    pytest.mark.skipif(
        not kueue_running(), reason="the bed runs without the Kueue controller (GPU_AUDITOR_TESTBED_KUEUE=0)"
    ),
]

K = "kueue.x-k8s.io"
STARTED = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)

#: (verb, resource) the ServiceAccount may use in the Kueue API, requeue off → on
ALLOWED_OFF = {(v, r) for v in ("get", "list", "watch") for r in ("workloads", "localqueues")}
ALLOWED_ON = ALLOWED_OFF | {("patch", "workloads")}
KUEUE_RESOURCES = (
    "workloads",
    "workloads/status",
    "localqueues",
    "localqueues/status",
    "clusterqueues",
    "clusterqueues/status",
    "workloadpriorityclasses",
    "resourceflavors",
    "admissionchecks",
    "cohorts",
    "topologies",
    "provisioningrequestconfigs",
    "multikueueclusters",
    "multikueueconfigs",
)
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


def _kueue_grants(sa: ServiceAccount) -> set[tuple[str, str]]:
    """Every (verb, resource) of the Kueue API the ServiceAccount is allowed, by SubjectAccessReview."""
    out = set()
    for res in KUEUE_RESOURCES:
        plural, _, sub = res.partition("/")
        for verb in VERBS:
            if _sar(sa, verb, plural, sub):
                out.add((verb, res))
    return out


def _sar(sa: ServiceAccount, verb: str, resource: str, subresource: str = "") -> bool:
    from kubernetes import client

    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=sa.user,
            groups=sa.groups,
            resource_attributes=client.V1ResourceAttributes(
                verb=verb, group=K, resource=resource, subresource=subresource or None
            ),
        )
    )
    return client.AuthorizationV1Api(sa.api_client).create_subject_access_review(review).status.allowed


def _until(probe: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll (the apiserver loads RBAC and admission policies, and Kueue acts, asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.1)


def _denied(sa: ServiceAccount, *args: str, input: str | None = None) -> None:
    sa.run(*args, input=input, ok=False)


def test_kueue_permissions_as_the_service_account(chart: Chart, namespace: str, kube_admin, testbed):
    from kubernetes import client

    release, other = namespace, f"{namespace}-k"
    client.CoreV1Api(kube_admin).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))
    try:
        with gpu_quota(kube_admin, other) as cq:
            _check(chart, release, namespace, other, cq, kube_admin, testbed)
    finally:
        drop_release(chart, namespace, release)
        client.CoreV1Api(kube_admin).delete_namespace(other)


def _check(chart: Chart, release: str, namespace: str, other: str, cq: str, admin: Any, testbed: Any) -> None:
    chart.helm("install", release, str(CHART), "-n", namespace)
    sa = ServiceAccount(chart, namespace, f"{release}-gpu-auditor", admin)
    as_sa = api_client(KubeConfig(kubeconfig=testbed.kubeconfig, impersonate=sa.user))
    job = gpu_job(admin, other, "train")
    wl_name = job_workload(admin, other, job)["metadata"]["name"]
    wl_path = resource_path(KV, "workloads", other, wl_name)
    _until(lambda: has_condition(call_json(admin, wl_path), "Admitted"), "the Job admitted through real quota")
    job_controller_starts(
        admin, other, call_json(admin, resource_path("batch/v1", "jobs", other, "train")), "train-0", STARTED
    )

    # Requeue off: reads only.
    assert _kueue_grants(sa) == ALLOWED_OFF
    resolver = KubeResolver(as_sa, kueue=True).start()
    try:
        assert resolver.wait_synced(30), "the resolver's informers did not sync as the ServiceAccount"
        info = _until(
            lambda: next(
                (
                    j
                    for j in resolver.jobs().values()
                    if j.ref.namespace == other and j.ref.name == "train" and j.cluster_queue
                ),
                None,
            ),
            "the resolver attributes the Job to its queues",
        )
        assert (info.workload, info.local_queue, info.cluster_queue) == (wl_name, "lq", cq)
    finally:
        resolver.stop()
    kube = KubeActions(as_sa, "test")
    target = kube.requeue_target(ActionTarget(key=JobKey("default", other, "Job", "train")))
    assert (target["type"], target["name"], target["reserved"], target["priority_boost"]) == (
        "workload",
        wl_name,
        True,
        0,
    )
    assert kube.holds_quota(target) is True
    with pytest.raises(PermanentError, match="403"):
        kube.deactivate(target, lower_priority_by=10)
    _denied(
        sa, "patch", "workloads.kueue.x-k8s.io", wl_name, "-n", other, "--type=merge", "-p", '{"spec":{"active":false}}'
    )
    _denied_always(sa, other, wl_name, cq)

    # Requeue on: the Workload patch too, fenced to spec.active and the priority boost.
    chart.helm("upgrade", release, str(CHART), "-n", namespace, "--reuse-values", "--set", "requeue.enabled=true")
    assert _kueue_grants(sa) == ALLOWED_ON
    t0 = time.monotonic()
    done = _until(lambda: _try_deactivate(kube, target), "the requeue patch passes RBAC and the fence")
    assert (done["new_priority_boost"], done["active"]) == (-10, False)
    evicted = _until(
        lambda: has_condition(call_json(admin, wl_path), "Evicted"), "Kueue evicts the deactivated Workload"
    )
    assert evicted and kube.holds_quota(target) is True  # the Job still has its pod
    job_controller_stops(admin, other, "train", "train-0")
    _until(lambda: kube.holds_quota(target) is False, "the quota release, read as the ServiceAccount")
    released = time.monotonic() - t0
    kube.reactivate(target)
    _until(lambda: has_condition(call_json(admin, wl_path), "Admitted"), "Kueue re-admits the reactivated Workload")
    wl = call_json(admin, wl_path)
    assert wl["spec"]["active"] is True and wl["metadata"]["annotations"][KUEUE_PRIORITY_BOOST] == "-10"
    assert (wl["spec"].get("priority", 0), wl["spec"]["queueName"]) == (0, "lq")
    print(f"as the ServiceAccount: deactivate → quota released (pods removed) in {released:.2f} s")
    _denied_always(sa, other, wl_name, cq)
    fence = f"{release}-gpu-auditor-write-fence"
    for body in (
        '{"spec":{"priority":1000}}',  # (a queue change Kueue's own webhook refuses first)
        '{"metadata":{"annotations":{"kueue.x-k8s.io/priority-boost":"-10","kueue.x-k8s.io/x":"y"}}}',
    ):
        res = chart.kubectl(
            "patch",
            "workloads.kueue.x-k8s.io",
            wl_name,
            "-n",
            other,
            "--type=merge",
            "-p",
            body,
            *sa.as_args,
            check=False,
        )
        assert res.rc != 0 and f"ValidatingAdmissionPolicy '{fence}'" in res.err, (body, res.err or res.out)

    # And off again: the patch goes with the value.
    chart.helm("upgrade", release, str(CHART), "-n", namespace, "--reuse-values", "--set", "requeue.enabled=false")
    assert _kueue_grants(sa) == ALLOWED_OFF
    _until(lambda: _forbidden(kube, target), "the Workload patch is denied again")


def _try_deactivate(kube: KubeActions, target: dict) -> dict | None:
    try:
        return kube.deactivate(target, lower_priority_by=10)
    except PermanentError as exc:  # RBAC or the fence not yet updated (informers)
        assert "403" in str(exc) or "422" in str(exc), exc
        return None


def _forbidden(kube: KubeActions, target: dict) -> bool:
    try:
        kube.reactivate(target)
    except PermanentError as exc:
        return "403" in str(exc)
    return False


def _denied_always(sa: ServiceAccount, ns: str, wl_name: str, cq: str) -> None:
    """What the ServiceAccount may never do in the Kueue API, nor to Secrets, requeue on or off."""
    workload = (
        f'{{"apiVersion":"{KV}","kind":"Workload","metadata":{{"name":"forged","namespace":"{ns}"}},'
        '"spec":{"queueName":"lq","podSets":[{"name":"main","count":1,"template":{"spec":{'
        '"restartPolicy":"Never","containers":[{"name":"c","image":"busybox"}]}}}]}}'
    )
    _denied(sa, "create", "-f", "-", input=workload)
    _denied(sa, "delete", "workloads.kueue.x-k8s.io", wl_name, "-n", ns, "--wait=false")
    _denied(
        sa,
        "patch",
        "workloads.kueue.x-k8s.io",
        wl_name,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"conditions":[]}}',
    )
    _denied(sa, "get", "clusterqueues.kueue.x-k8s.io", cq)
    _denied(sa, "patch", "clusterqueues.kueue.x-k8s.io", cq, "--type=merge", "-p", '{"spec":{"stopPolicy":"Hold"}}')
    _denied(
        sa,
        "patch",
        "localqueues.kueue.x-k8s.io",
        "lq",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"stopPolicy":"Hold"}}',
    )
    _denied(sa, "get", "workloadpriorityclasses.kueue.x-k8s.io")
    _denied(sa, "get", "resourceflavors.kueue.x-k8s.io")
    _denied(sa, "get", "secrets", "-n", ns)
    _denied(sa, "delete", "job", "train", "-n", ns, "--wait=false")
