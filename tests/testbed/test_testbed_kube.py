"""The test bed's kube-apiserver, controller manager and CRDs, exercised for real."""

from __future__ import annotations

import subprocess
import time
import uuid

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from auditor.testbed import config

pytestmark = pytest.mark.testbed


def test_version_is_the_pinned_release(kube_admin):
    info = k8s.VersionApi(kube_admin).get_code()
    assert info.git_version == f"v{config.K8S_VERSION}"
    assert (info.major, info.minor) == ("1", config.K8S_VERSION.split(".")[1])


def test_create_and_read_an_object(kube_admin, namespace):
    core = k8s.CoreV1Api(kube_admin)
    core.create_namespaced_config_map(
        namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="probe"), data={"answer": "42"})
    )
    got = core.read_namespaced_config_map("probe", namespace)
    assert got.data == {"answer": "42"}
    assert got.metadata.uid


def test_pods_can_be_bound_and_their_status_patched(kube_admin, namespace):
    """No kubelet or scheduler: tests bind pods themselves and patch their phase."""
    core = k8s.CoreV1Api(kube_admin)
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="trainer-0"),
        spec=k8s.V1PodSpec(node_name="gpu-node-1", containers=[k8s.V1Container(name="c", image="x")]),
    )
    core.create_namespaced_pod(namespace, pod)
    core.patch_namespaced_pod_status("trainer-0", namespace, {"status": {"phase": "Running"}})
    assert core.read_namespaced_pod("trainer-0", namespace).status.phase == "Running"


def test_rbac_denies_a_plain_service_account_via_review(kube_admin):
    sar = k8s.V1SubjectAccessReview(
        spec=k8s.V1SubjectAccessReviewSpec(
            user="system:serviceaccount:default:nobody",
            # a SubjectAccessReview does not add the ServiceAccount groups itself
            groups=["system:serviceaccounts", "system:serviceaccounts:default", "system:authenticated"],
            resource_attributes=k8s.V1ResourceAttributes(verb="list", resource="secrets"),
        )
    )
    result = k8s.AuthorizationV1Api(kube_admin).create_subject_access_review(sar)
    assert result.status.allowed is False


def test_rbac_denies_a_plain_service_account_via_impersonation(testbed):
    from kubernetes import config as kube_config

    api = kube_config.new_client_from_config(config_file=testbed.kubeconfig)
    api.set_default_header("Impersonate-User", "system:serviceaccount:default:nobody")
    try:
        with pytest.raises(ApiException) as err:
            k8s.CoreV1Api(api).list_secret_for_all_namespaces()
        assert err.value.status == 403
    finally:
        api.close()
    out = subprocess.run(
        [
            testbed.kubectl,
            f"--kubeconfig={testbed.kubeconfig}",
            "auth",
            "can-i",
            "list",
            "secrets",
            "-A",
            "--as=system:serviceaccount:default:nobody",
        ],
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "no"


def test_the_project_crds_are_established(kube_admin):
    crds = k8s.ApiextensionsV1Api(kube_admin).list_custom_resource_definition().items
    established = {
        c.metadata.name
        for c in crds
        if any(cond.type == "Established" and cond.status == "True" for cond in c.status.conditions or [])
    }
    for name in (
        "workloads.kueue.x-k8s.io",
        "clusterqueues.kueue.x-k8s.io",
        "localqueues.kueue.x-k8s.io",
        "resourceflavors.kueue.x-k8s.io",
        "servicemonitors.monitoring.coreos.com",
        "prometheusrules.monitoring.coreos.com",
        "pytorchjobs.kubeflow.org",
        "trainjobs.trainer.kubeflow.org",
    ):
        assert name in established


def test_kueue_and_servicemonitor_objects_round_trip(kube_admin, namespace):
    custom = k8s.CustomObjectsApi(kube_admin)
    custom.create_namespaced_custom_object(
        "kueue.x-k8s.io",
        "v1beta2",
        namespace,
        "localqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "team-a"},
            "spec": {"clusterQueue": "gpu"},
        },
    )
    custom.create_namespaced_custom_object(
        "monitoring.coreos.com",
        "v1",
        namespace,
        "servicemonitors",
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": "dcgm"},
            "spec": {"selector": {"matchLabels": {"app": "dcgm-exporter"}}, "endpoints": [{"port": "metrics"}]},
        },
    )
    lq = custom.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "localqueues", "team-a")
    assert lq["spec"]["clusterQueue"] == "gpu"
    sm = custom.get_namespaced_custom_object("monitoring.coreos.com", "v1", namespace, "servicemonitors", "dcgm")
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"


def _wait_gone(read, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            read()
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        time.sleep(0.5)
    return False


def test_garbage_collector_deletes_dependents(kube_admin, namespace):
    core = k8s.CoreV1Api(kube_admin)
    owner = core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="owner")))
    ref = k8s.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
    core.create_namespaced_config_map(
        namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="dependent", owner_references=[ref]))
    )
    core.delete_namespaced_config_map("owner", namespace)
    assert _wait_gone(lambda: core.read_namespaced_config_map("dependent", namespace))


def test_namespace_controller_finalizes_deleted_namespaces(kube_admin):
    core = k8s.CoreV1Api(kube_admin)
    name = f"t-{uuid.uuid4().hex[:12]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    core.create_namespaced_config_map(name, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="x")))
    core.delete_namespace(name)
    assert _wait_gone(lambda: core.read_namespace(name))


def test_a_real_service_account_token_authenticates_and_is_denied(testbed, kube_admin, namespace):
    """serviceaccount-token signing works with the apiserver's flags; RBAC then denies the SA."""
    core = k8s.CoreV1Api(kube_admin)
    core.create_namespaced_service_account(namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="auditor")))
    token = core.create_namespaced_service_account_token(
        "auditor", namespace, k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[]))
    ).status.token
    cfg = k8s.Configuration()
    cfg.host = kube_admin.configuration.host
    cfg.ssl_ca_cert = kube_admin.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token}"}
    with k8s.ApiClient(cfg) as as_sa:
        review = k8s.AuthenticationV1Api(as_sa).create_self_subject_review(k8s.V1SelfSubjectReview())
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:auditor"
        with pytest.raises(ApiException) as err:
            k8s.CoreV1Api(as_sa).list_namespaced_secret(namespace)
        assert err.value.status == 403


def test_gpu_nodes_can_be_faked(kube_admin):
    core = k8s.CoreV1Api(kube_admin)
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name=name, labels={"nvidia.com/gpu.product": "NVIDIA-H200"})))
    try:
        core.patch_node_status(
            name, {"status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}}
        )
        assert core.read_node(name).status.capacity["nvidia.com/gpu"] == "8"
    finally:
        core.delete_node(name)
