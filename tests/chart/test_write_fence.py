"""The chart's write fence: a ValidatingAdmissionPolicy that narrows what RBAC lets the operator patch.

RBAC (files/permissions.yaml) lets the ServiceAccount patch pods and every job kind cluster-wide,
so that it can annotate them; RBAC cannot say which fields. The fence, installed by default,
lets this ServiceAccount change only `gpu-auditor.io/` annotations and, with requeue on, a Job's
`spec.suspend` and a Kueue Workload's `spec.active` and `kueue.x-k8s.io/priority-boost`. Proven on the test bed's
real kube-apiserver (v1.36) by impersonating the ServiceAccount: a pod template, labels, other
annotations and other spec fields are denied by the policy, while the operator's own writes
(auditor/actions/kube.py: annotate, requeue deactivate/reactivate with priority lowering) pass.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from chartlib import CHART, Chart, Result, ServiceAccount, drop_release, find

from auditor.actions.kube import KubeActions
from auditor.core.action_target import ActionTarget
from auditor.core.identity import JobKey
from auditor.kube.client import KubeConfig, api_client, call_json, resource_path

pytestmark = pytest.mark.testbed

KV = "kueue.x-k8s.io/v1beta2"
VERDICT = "gpu-auditor.io/verdict"


def write_grants(objs: list[dict]) -> set[tuple[str, str]]:
    """(group, resource) of every cluster-wide patch/update grant of the rendered ClusterRole."""
    return {
        (g, r)
        for o in find(objs, "ClusterRole")
        for rule in o["rules"]
        if {"patch", "update"} & set(rule["verbs"])
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }


def fenced(policy: dict) -> set[tuple[str, str]]:
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert all(r["operations"] == ["UPDATE"] for r in rules), rules
    return {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}


@pytest.mark.parametrize(
    "sets",
    [[], ["requeue.enabled=true"], ["features.annotate=false", "requeue.enabled=true"]],
    ids=["defaults", "requeue", "requeue-only"],
)
def test_fence_covers_every_cluster_wide_write_grant(chart: Chart, sets):
    objs = chart.render(sets=sets)
    (policy,) = find(objs, "ValidatingAdmissionPolicy")
    (binding,) = find(objs, "ValidatingAdmissionPolicyBinding")
    assert write_grants(objs) and fenced(policy) == write_grants(objs)
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    (cond,) = policy["spec"]["matchConditions"]
    assert cond["expression"] == "request.userInfo.username == 'system:serviceaccount:gpu-auditor:ga-gpu-auditor'"


@pytest.mark.parametrize(
    "sets", [["rbac.writeFence.enabled=false"], ["features.annotate=false"]], ids=["switched-off", "nothing-to-fence"]
)
def test_no_fence_when_off_or_nothing_to_fence(chart: Chart, sets):
    objs = chart.render(sets=sets)
    assert not find(objs, "ValidatingAdmissionPolicy") and not find(objs, "ValidatingAdmissionPolicyBinding")
    if "features.annotate=false" in sets:
        assert not write_grants(objs)


def test_fence_on_a_cluster_without_the_v1_api_fails_naming_the_switch(chart: Chart):
    # Chart.yaml's floor (1.30) is the fence's: a cluster that lacks the API is one that switched it
    # off, seen in discovery (--api-versions stands in for it; tests/chart/test_version_floors.py)
    discovered = ["--kube-version", "1.30.4", "--api-versions", "v1/Pod"]
    res = chart.helm("template", "ga", str(CHART), *discovered, check=False)
    assert res.rc != 0 and "rbac.writeFence.enabled=false" in res.err and "1.30.4" in res.err, res.err
    off = chart.helm("template", "ga", str(CHART), *discovered, "--set", "rbac.writeFence.enabled=false")
    assert "ValidatingAdmissionPolicy" not in off.out


def _spec_fields(expression: str, resource: str) -> set[str]:
    """The spec fields the fence compares for `resource` (jobs|workloads), from its expression."""
    branch = re.search(rf"request\.resource\.resource == '{resource}'\) \?\s*\((.*?)\) :", expression, re.S)
    assert branch, expression
    return set(re.findall(r"object\.spec\.\?(\w+) == oldObject\.spec\.\?\1", branch.group(1)))


def test_fence_field_lists_match_the_apiserver_schemas(chart: Chart, kube_admin):
    """A field the fence does not list could be changed with a requeue: the lists must be the
    apiserver's JobSpec and the Kueue CRD's Workload spec, less the fields a requeue writes."""
    (policy,) = find(chart.render(sets=["requeue.enabled=true"]), "ValidatingAdmissionPolicy")
    (spec_rule,) = [
        v["expression"]
        for v in policy["spec"]["validations"]
        if "request.resource.resource == 'jobs'" in v["expression"]
    ]
    versions = {
        (r["apiGroups"][0], r["resources"][0]): r["apiVersions"]
        for r in policy["spec"]["matchConstraints"]["resourceRules"]
    }
    assert versions[("batch", "jobs")] == ["v1"] and versions[("kueue.x-k8s.io", "workloads")] == ["v1beta2"]
    assert policy["spec"]["matchConstraints"]["matchPolicy"] == "Equivalent"

    openapi = call_json(kube_admin, "/openapi/v3/apis/batch/v1")
    job_spec = set(openapi["components"]["schemas"]["io.k8s.api.batch.v1.JobSpec"]["properties"])
    assert _spec_fields(spec_rule, "jobs") == job_spec - {"suspend"}
    crd = call_json(
        kube_admin,
        resource_path("apiextensions.k8s.io/v1", "customresourcedefinitions", None, "workloads.kueue.x-k8s.io"),
    )
    (v1beta2,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta2"]
    wl_spec = set(v1beta2["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])
    assert _spec_fields(spec_rule, "workloads") == wl_spec - {"active"}


def _as_sa(sa: ServiceAccount, *args: str) -> Result:
    return sa.chart.kubectl(*args, *sa.as_args, check=False)


def _denied_by_fence(res: Result, policy: str) -> bool:
    return res.rc != 0 and f"ValidatingAdmissionPolicy '{policy}'" in res.err


def _wait_for(probe, what: str, timeout: float = 30.0) -> None:
    """The apiserver loads policies and bindings asynchronously (informers): poll, never sleep blind."""
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.5)


def _objects(chart: Chart, ns: str) -> None:
    chart.kubectl(
        "apply",
        "-n",
        ns,
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": "gpu-pod",
                            "labels": {"app": "train"},
                            "annotations": {"team.example/owner": "a"},
                        },
                        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]},
                    },
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": "probe"},
                        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]},
                    },
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "metadata": {"name": "web"},
                        "spec": {
                            "replicas": 1,
                            "selector": {"matchLabels": {"app": "web"}},
                            "template": {
                                "metadata": {"labels": {"app": "web"}},
                                "spec": {"containers": [{"name": "web", "image": "busybox"}]},
                            },
                        },
                    },
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "metadata": {"name": "train"},
                        "spec": {
                            "suspend": True,
                            "parallelism": 1,
                            "template": {
                                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}
                            },
                        },
                    },
                    {
                        "apiVersion": "batch/v1",
                        "kind": "CronJob",
                        "metadata": {"name": "nightly"},
                        "spec": {
                            "schedule": "0 3 * * *",
                            "jobTemplate": {
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "restartPolicy": "Never",
                                            "containers": [{"name": "c", "image": "busybox"}],
                                        }
                                    }
                                }
                            },
                        },
                    },
                    {
                        "apiVersion": "kubeflow.org/v1",
                        "kind": "PyTorchJob",
                        "metadata": {"name": "pt"},
                        "spec": {
                            "pytorchReplicaSpecs": {
                                "Master": {
                                    "replicas": 1,
                                    "template": {"spec": {"containers": [{"name": "pytorch", "image": "busybox"}]}},
                                }
                            }
                        },
                    },
                    {
                        "apiVersion": KV,
                        "kind": "Workload",
                        "metadata": {"name": "train-1"},
                        "spec": {
                            "active": True,
                            "queueName": "team-a",
                            "priority": 100,
                            "podSets": [
                                {
                                    "name": "main",
                                    "count": 1,
                                    "template": {
                                        "spec": {
                                            "restartPolicy": "Never",
                                            "containers": [{"name": "c", "image": "busybox"}],
                                        }
                                    },
                                }
                            ],
                        },
                    },
                ],
            }
        ),
    )


def test_fence_denies_other_writes_and_passes_the_operators(chart: Chart, namespace: str, kube_admin, testbed):
    from kubernetes import client

    release, other = namespace, f"{namespace}-w"
    client.CoreV1Api(kube_admin).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))
    try:
        chart.helm("install", release, str(CHART), "-n", namespace, "--set", "requeue.enabled=true")
        name = f"{release}-gpu-auditor"
        policy = f"{name}-write-fence"
        sa = ServiceAccount(chart, namespace, name, kube_admin)
        _objects(chart, other)
        _wait_for(
            lambda: _denied_by_fence(
                _as_sa(sa, "label", "pod", "probe", "-n", other, "probe=1", "--overwrite"), policy
            ),
            "the fence denies the ServiceAccount a label",
        )

        patch = ["--type=merge", "-p"]
        denied = {
            "a Deployment's pod template": (
                "patch",
                "deployment",
                "web",
                *patch,
                '{"spec":{"template":{"spec":{"containers":[{"name":"web","image":"evil"}]}}}}',
            ),
            "a suspended Job's pod template": (
                "patch",
                "job",
                "train",
                *patch,
                '{"spec":{"template":{"spec":{"nodeSelector":{"pool":"x"}}}}}',
            ),
            "a Job's parallelism": ("patch", "job", "train", *patch, '{"spec":{"parallelism":4}}'),
            "a Job's suspend and parallelism at once": (
                "patch",
                "job",
                "train",
                *patch,
                '{"spec":{"suspend":false,"parallelism":4}}',
            ),
            "a CronJob's schedule": ("patch", "cronjob", "nightly", *patch, '{"spec":{"schedule":"* * * * *"}}'),
            "a PyTorchJob's image": (
                "patch",
                "pytorchjobs.kubeflow.org",
                "pt",
                "--type=json",
                "-p",
                '[{"op":"replace","path":"/spec/pytorchReplicaSpecs/Master/template/spec/containers/0/image","value":"evil"}]',
            ),
            "a Workload's queue": (
                "patch",
                "workloads.kueue.x-k8s.io",
                "train-1",
                *patch,
                '{"spec":{"queueName":"vip"}}',
            ),
            "a Workload's spec.priority": (
                "patch",
                "workloads.kueue.x-k8s.io",
                "train-1",
                *patch,
                '{"spec":{"priority":1000}}',
            ),
            "Kueue's priority boost on a Job": ("annotate", "job", "train", "kueue.x-k8s.io/priority-boost=-10"),
            "another kueue annotation on a Workload": (
                "annotate",
                "workloads.kueue.x-k8s.io",
                "train-1",
                "kueue.x-k8s.io/x=y",
            ),
            "a pod label": ("label", "pod", "gpu-pod", "-n", other, "app=evil", "--overwrite"),
            "a Job label": ("label", "job", "train", "-n", other, "team=evil"),
            "another annotation": ("annotate", "pod", "gpu-pod", "example.com/x=y"),
            "a look-alike prefix": ("annotate", "pod", "gpu-pod", "gpu-auditor.io.evil.example/x=y"),
            "changing a foreign annotation": ("annotate", "pod", "gpu-pod", "team.example/owner=b", "--overwrite"),
            "removing a foreign annotation": ("annotate", "pod", "gpu-pod", "team.example/owner-"),
            "ours plus a label in one patch": (
                "patch",
                "pod",
                "gpu-pod",
                *patch,
                '{"metadata":{"annotations":{"gpu-auditor.io/x":"1"},"labels":{"app":"evil"}}}',
            ),
            "owner references": (
                "patch",
                "deployment",
                "web",
                *patch,
                '{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"x","uid":"1"}]}}',
            ),
        }
        for what, args in denied.items():
            res = _as_sa(sa, *args, *([] if "-n" in args else ["-n", other]))
            assert _denied_by_fence(res, policy), f"{what}: {res.err or res.out}"

        # The ServiceAccount's own annotations: add, overwrite, remove.
        sa.run("annotate", "pod", "gpu-pod", "-n", other, f"{VERDICT}=low_sm_efficiency")
        sa.run("annotate", "pod", "gpu-pod", "-n", other, f"{VERDICT}=ok", "--overwrite")
        sa.run("annotate", "pod", "gpu-pod", "-n", other, f"{VERDICT}-")

        # The operator's real writes, through its own code, as the ServiceAccount.
        kube = KubeActions(api_client(KubeConfig(kubeconfig=testbed.kubeconfig, impersonate=sa.user)))
        ann = {VERDICT: "low_sm_efficiency", "gpu-auditor.io/sm-active": "0.02"}
        assert (
            kube.annotate(ActionTarget(key=JobKey("default", other, "Job", "train"), pods=("gpu-pod",)), ann)["missing"]
            == []
        )
        for job in ("Deployment/web", "CronJob/nightly", "PyTorchJob/pt"):
            assert kube.annotate(ActionTarget(key=JobKey.of("default", other, job)), ann)["annotated"] == [job]
        wl = {"type": "workload", "namespace": other, "name": "train-1", "priority": 100, "priority_boost": 0}
        assert kube.deactivate(wl, lower_priority_by=10)["effective_priority"] == 90
        kube.reactivate(wl)
        job = {"type": "job", "namespace": other, "name": "train"}
        kube.reactivate(job)
        kube.deactivate(job)

        got = {
            k: call_json(kube_admin, resource_path(v, p, other, n))
            for k, (v, p, n) in {
                "pod": ("v1", "pods", "gpu-pod"),
                "job": ("batch/v1", "jobs", "train"),
                "deploy": ("apps/v1", "deployments", "web"),
                "cron": ("batch/v1", "cronjobs", "nightly"),
                "pt": ("kubeflow.org/v1", "pytorchjobs", "pt"),
                "wl": (KV, "workloads", "train-1"),
            }.items()
        }
        for k in ("pod", "job", "deploy", "cron", "pt"):
            assert got[k]["metadata"]["annotations"][VERDICT] == "low_sm_efficiency", k
        assert got["pod"]["metadata"]["labels"] == {"app": "train"}
        assert got["pod"]["metadata"]["annotations"]["team.example/owner"] == "a"
        assert got["job"]["spec"]["suspend"] is True and got["job"]["spec"]["parallelism"] == 1
        assert not got["job"]["spec"]["template"]["spec"].get("nodeSelector")
        assert got["deploy"]["spec"]["template"]["spec"]["containers"][0]["image"] == "busybox"
        assert got["cron"]["spec"]["schedule"] == "0 3 * * *"
        assert (
            got["pt"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["image"]
            == "busybox"
        )
        assert (got["wl"]["spec"]["active"], got["wl"]["spec"]["priority"], got["wl"]["spec"]["queueName"]) == (
            True,
            100,
            "team-a",
        )
        assert got["wl"]["metadata"]["annotations"]["kueue.x-k8s.io/priority-boost"] == "-10"

        # Only this ServiceAccount is fenced: the admin still changes labels.
        chart.kubectl("label", "pod", "gpu-pod", "-n", other, "app=relabelled", "--overwrite")

        # Switched off, RBAC alone decides again (and lets it relabel: what the fence is for).
        chart.helm(
            "upgrade", release, str(CHART), "-n", namespace, "--reuse-values", "--set", "rbac.writeFence.enabled=false"
        )
        _wait_for(
            lambda: _as_sa(sa, "label", "pod", "gpu-pod", "-n", other, "app=evil", "--overwrite").rc == 0,
            "without the fence, RBAC lets the ServiceAccount relabel a pod",
        )
        chart.helm("uninstall", release, "-n", namespace)
    finally:
        drop_release(chart, namespace, release)
        client.CoreV1Api(kube_admin).delete_namespace(other)
