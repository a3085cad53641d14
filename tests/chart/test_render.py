"""helm lint and helm template with the real helm binary: what the chart renders, and what it refuses."""

from __future__ import annotations

import json

import pytest
import yaml
from chartlib import CHART, FULL_VALUES, Chart, find, pod_specs

pytestmark = pytest.mark.testbed


def rules_of(objs: list[dict], kind: str) -> list[dict]:
    return [r for o in find(objs, kind) for r in o["rules"]]


def grants(rules: list[dict], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


@pytest.mark.parametrize("values", [[], [FULL_VALUES]], ids=["defaults", "full"])
def test_lint_is_clean(chart: Chart, values):
    res = chart.helm("lint", "--strict", str(CHART), *chart.value_args(values))
    assert "0 chart(s) failed" in res.out
    assert "[WARNING]" not in res.out and "[ERROR]" not in res.out and "[INFO]" not in res.out, res.out


def test_defaults_render(chart: Chart):
    objs = chart.render()
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted(
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "ConfigMap",
            "Deployment",
            "NetworkPolicy",
            "PersistentVolumeClaim",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
    )
    (dep,) = find(objs, "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["gpu-auditor"]
    assert c["args"] == ["run", "--config", "/etc/gpu-auditor/settings.yaml"]
    assert {m["mountPath"] for m in c["volumeMounts"]} == {
        "/etc/gpu-auditor/settings.yaml",
        "/etc/gpu-auditor/policies",
        "/tmp",
        "/var/lib/gpu-auditor",
    }
    (pvc,) = find(objs, "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_full_values_render_every_feature(chart: Chart):
    objs = chart.render(values=[FULL_VALUES])
    for kind in (
        "ServiceMonitor",
        "PrometheusRule",
        "DaemonSet",
        "Deployment",
        "ClusterRole",
        "Role",
        "PodDisruptionBudget",
    ):
        assert find(objs, kind), kind
    assert not find(objs, "PersistentVolumeClaim")
    cms = {o["metadata"]["name"] for o in find(objs, "ConfigMap")}
    assert cms == {
        "ga-gpu-auditor-settings",
        "ga-gpu-auditor-policies",
        "ga-gpu-auditor-dashboard",
        "ga-gpu-auditor-dcgm-counters",
    }
    (dep,) = find(objs, "Deployment")
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"].startswith("registry.example.com/gpu-auditor@sha256:")
    secret_env = {
        e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert secret_env["GPU_AUDITOR_DATABASE_URL"] == {"name": "gpu-auditor-db", "key": "url"}
    assert secret_env["GPU_AUDITOR_PROMETHEUS_TOKEN"] == {"name": "gpu-auditor-prometheus", "key": "token"}
    assert secret_env["GPU_AUDITOR_SLACK_WEBHOOK_URL"]["key"] == "slack-url"
    assert secret_env["GPU_AUDITOR_ROUTE_ML_INFRA_SLACK_WEBHOOK_URL"]["key"] == "ml-infra-slack-url"
    (ds,) = find(objs, "DaemonSet")
    vol = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "pod-resources")
    mount = next(
        m for m in ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] if m["name"] == "pod-resources"
    )
    assert vol["hostPath"]["path"] == "/var/lib/kubelet/pod-resources" and mount["readOnly"] is True
    assert ds["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    # Prometheus finds the agents through a headless Service and keeps the pod labels they set.
    (agent_sm,) = find(objs, "ServiceMonitor", "ga-gpu-auditor-node-agent")
    (endpoint,) = agent_sm["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True and endpoint["port"] == "metrics"
    (agent_svc,) = find(objs, "Service", "ga-gpu-auditor-node-agent")
    assert agent_svc["spec"]["clusterIP"] == "None"
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in agent_svc["spec"]["selector"].items())
    assert all(
        agent_svc["metadata"]["labels"].get(k) == v for k, v in agent_sm["spec"]["selector"]["matchLabels"].items()
    )


def test_settings_file(chart: Chart):
    """The settings file carries the simple keys docs/install.md documents, and no secret values."""
    objs = chart.render(values=[FULL_VALUES])
    (cm,) = find(objs, "ConfigMap", "ga-gpu-auditor-settings")
    s = yaml.safe_load(cm["data"]["settings.yaml"])
    assert s["cluster"] == "test-cluster"
    assert s["prometheus"]["url"] == "https://thanos-query.monitoring.svc:10902"
    assert s["prometheus"]["bearer_token_env"] == "GPU_AUDITOR_PROMETHEUS_TOKEN"
    assert s["interval"] == "5m"
    assert s["store"]["url_env"] == "GPU_AUDITOR_DATABASE_URL" and "url" not in s["store"]
    assert s["policies"] == {"builtin": True, "dir": "/etc/gpu-auditor/policies"}
    assert s["leader_election"]["namespace"] == "gpu-auditor"
    assert s["leader_election"]["lease_name"] == "gpu-auditor-leader"
    assert s["features"]["requeue"] is True
    assert s["thresholds"] == {"low_sm": 0.25, "power_floor_w": {"RTX 6000 Ada": 100}}  # test_examples_load.py loads it
    assert s["max_lookback"] == "3d"  # extraSettings merged
    # the variables the chart sets are the ones `gpu-auditor audit --policies --act` reads
    from auditor.policy.config import chart_notifications

    cli = chart_notifications().model_dump(exclude_defaults=True)
    assert {k: s["notifications"][k] for k in ("slack", "webhook")} == cli
    (dep,) = find(objs, "Deployment")
    env = {e["name"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert {cli["slack"]["webhook_url_env"], cli["webhook"]["url_env"], cli["webhook"]["hmac_key_env"]} <= env
    default = yaml.safe_load(find(chart.render(), "ConfigMap", "ga-gpu-auditor-settings")[0]["data"]["settings.yaml"])
    assert default["store"]["url"] == "sqlite:////var/lib/gpu-auditor/gpu-auditor.db"
    assert default["features"]["requeue"] is False


@pytest.mark.parametrize("values", [[], [FULL_VALUES]], ids=["defaults", "full"])
def test_every_pod_is_hardened(chart: Chart, values):
    for spec in pod_specs(chart.render(values=values)):
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert sc["seccompProfile"]["type"] == "RuntimeDefault"
            assert sc.get("privileged", False) is False
    (dep,) = find(chart.render(values=values), "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["runAsNonRoot"] is True


def test_rbac_follows_features(chart: Chart):
    off = chart.render()
    on = chart.render(sets=["requeue.enabled=true"])
    for objs in (off, on):
        cluster, ns = rules_of(objs, "ClusterRole"), rules_of(objs, "Role")
        assert not any("secrets" in r["resources"] for r in cluster), "no Secrets cluster-wide"
        assert not any("delete" in r["verbs"] or "*" in r["verbs"] for r in cluster + ns)
        assert grants(cluster, "", "pods", "watch") and grants(cluster, "", "pods", "patch")
        assert grants(cluster, "events.k8s.io", "events", "create")
        assert grants(ns, "coordination.k8s.io", "leases", "update")
        assert grants(cluster, "kueue.x-k8s.io", "workloads", "watch")
    assert not grants(rules_of(off, "ClusterRole"), "kueue.x-k8s.io", "workloads", "patch")
    assert not grants(rules_of(off, "ClusterRole"), "batch", "jobs", "update")
    assert grants(rules_of(on, "ClusterRole"), "kueue.x-k8s.io", "workloads", "patch")
    assert grants(rules_of(on, "ClusterRole"), "batch", "jobs", "patch")
    # Grants no code uses (auditor/actions/kube.py merge-patches and creates events.k8s.io Events).
    for objs in (off, on):
        cluster = rules_of(objs, "ClusterRole")
        assert not grants(cluster, "", "events", "create") and not grants(cluster, "events.k8s.io", "events", "patch")
        assert not grants(cluster, "kueue.x-k8s.io", "workloads", "update") and not grants(
            cluster, "batch", "jobs", "update"
        )
        assert not any("workloadpriorityclasses" in r["resources"] for r in cluster)
    # Features switched off grant nothing.
    bare = rules_of(
        chart.render(sets=["features.annotate=false", "features.events=false", "features.kueue=false"]), "ClusterRole"
    )
    assert not any(v in r["verbs"] for r in bare for v in ("patch", "create", "update"))
    assert not any("kueue.x-k8s.io" in r["apiGroups"] for r in bare)


def test_secret_access_is_limited_to_referenced_secrets(chart: Chart):
    (rule,) = [r for r in rules_of(chart.render(values=[FULL_VALUES]), "Role") if "secrets" in r["resources"]]
    assert rule["verbs"] == ["get"]
    assert rule["resourceNames"] == ["gpu-auditor-alerts", "gpu-auditor-db", "gpu-auditor-prometheus"]
    assert not [r for r in rules_of(chart.render(), "Role") if "secrets" in r["resources"]], (
        "no Secret referenced: no Secret access at all (an empty resourceNames would mean all)"
    )


def test_replicas(chart: Chart):
    pg = ["store.type=postgresql", "store.postgresql.urlSecret.name=db"]
    assert find(chart.render(sets=pg), "Deployment")[0]["spec"]["replicas"] == 2
    assert find(chart.render(sets=pg + ["replicas=3"]), "Deployment")[0]["spec"]["replicas"] == 3
    assert find(chart.render(sets=["replicas=0"]), "Deployment")[0]["spec"]["replicas"] == 0


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["replica=2"], "additional properties 'replica' not allowed"),
        (["features.requeue=true"], "additional properties 'requeue' not allowed"),
        (["store.type=mysql"], "value must be one of 'sqlite', 'postgresql'"),
        (["audit.interval=5 minutes"], "'5 minutes' does not match pattern"),
        (["prometheus.url=prometheus:9090"], "at '/prometheus/url'"),
        (
            ["securityContext.readOnlyRootFilesystem=false"],
            "at '/securityContext/readOnlyRootFilesystem': value must be true",
        ),
        (["podSecurityContext.runAsNonRoot=false"], "at '/podSecurityContext/runAsNonRoot'"),
        (["prometheusRule.alerts.minCoverage=1.5"], "at '/prometheusRule/alerts/minCoverage'"),
        (["nodeAgent.capabilitiesAdd={NET_ADMIN}"], "at '/nodeAgent/capabilitiesAdd/0'"),
        (["replicas=2"], "replicas=2 needs store.type=postgresql"),
        (["store.type=postgresql"], "store.type=postgresql needs store.postgresql.urlSecret.name"),
    ],
)
def test_bad_values_are_rejected_clearly(chart: Chart, sets, message):
    res = chart.template_text(sets=sets, check=False)
    assert res.rc != 0
    assert message in res.err, res.err


def test_schema_is_valid_json_and_strict():
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])
