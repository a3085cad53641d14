"""The chart installed for real: its pods run on the bed's node (kubelet + containerd) from the
image built here (docs/install.md), as a user's first `helm install` would run them.

One release for the module (each pod start costs seconds on this machine); the tests run in file
order on it: the operator pod comes up, audits a GPU pod running on the node and alerts, the agent
attributes that pod's GPU through the kubelet, the operator survives its pod, and upgrade and
uninstall leave nothing behind. What the bed's plumbing adds to the pods (host network, the
apiserver address, the ServiceAccount token volume, the tests' scheduler, the agent's recorded GPU
source) is in postrender.py; the chart itself is installed unchanged.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import pytest
import requests
import yaml
from kubeobjects import batch_job, create, owner_ref
from kubernetes import client as k8s
from kubernetes import config as kube_config
from nodelib import (
    CHART,
    cluster_view,
    container_pid,
    helm,
    lease_holder,
    postrender_args,
    process_environ,
    ready_pods,
    wait_for,
)
from policy.policy_receivers import Receiver

from auditor import traces
from auditor.core.model import PodRef
from auditor.testbed import deviceplugin, image, node, process

pytestmark = pytest.mark.testbed

TRACE, PHASE = "h200-microbench", "one_sm_spin"
INTERVAL = timedelta(seconds=15)
POLICY = """\
apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata:
  name: tell-low-sm
spec:
  mode: enforce
  verdicts: [low_sm_efficiency]
  escalation:
    - actions: [annotate, notify]
"""


@dataclass
class Release:
    name: str
    namespace: str
    work_namespace: str
    lease: str
    core: k8s.CoreV1Api
    apps: k8s.AppsV1Api
    coord: k8s.CoordinationV1Api
    slack: Receiver
    gpu_pod: str
    values: list[str]

    pod_logs: Path

    def explain(self, testbed) -> str:
        return cluster_view(testbed, self.namespace, self.pod_logs)


def _gpu_pod(namespace: str, job: dict, node_name: str, pause_image: str) -> dict:
    """A training pod of ``job`` on the real node, holding one (fake) GPU through the device plugin."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train-0-abcde", "namespace": namespace, "ownerReferences": [owner_ref(job)]},
        "spec": {
            "nodeName": node_name,
            "tolerations": [{"key": node.TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": pause_image,
                    "imagePullPolicy": "Never",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def _backfill_history(testbed, namespace: str, pod: str, case: str) -> None:
    """An hour of one-SM-spin history for the pod (recorded on an H200), reaching past now."""
    trace = traces.load_trace(TRACE)
    cycle = len(trace.steady(PHASE)) * INTERVAL
    duration = cycle * math.ceil(timedelta(minutes=60) / cycle)
    end = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(minutes=2)
    tj = traces.TraceJob(PodRef(namespace, pod, "main"), traces.make_gpus(1, f"{case}-node"), PHASE, duration=duration)
    text = traces.trace_to_openmetrics(trace, [tj], end=end, duration=duration, interval=INTERVAL)
    testbed.backfill(re.sub(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{", rf'\1{{case="{case}",', text, flags=re.M))


@pytest.fixture(scope="module")
def release(testbed, bed_node, workload_controllers, module_database, tmp_path_factory) -> Iterator[Release]:
    api = kube_config.new_client_from_config(config_file=testbed.kubeconfig)
    core, apps = k8s.CoreV1Api(api), k8s.AppsV1Api(api)
    name, case = f"ga-{uuid.uuid4().hex[:6]}", f"node{uuid.uuid4().hex[:8]}"
    ns, work_ns = f"t-{name}", f"t-{name}-w"
    slack = Receiver()
    for n in (ns, work_ns):
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=n)))
    try:
        # a GPU job running on the node before the operator starts (its first cycle audits it)
        job = batch_job(api, work_ns, "train", suspend=True)
        pod = _gpu_pod(work_ns, job, bed_node.name, image.build_pause().ref)
        create(api, "v1", "pods", work_ns, pod)
        _backfill_history(testbed, work_ns, pod["metadata"]["name"], case)

        for secret, url in (("db", module_database), ("slack", slack.url)):
            core.create_namespaced_secret(
                ns, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=secret), string_data={"url": url})
            )
        values = {
            "image": {"repository": bed_node.image_repository, "tag": bed_node.image_tag, "pullPolicy": "Never"},
            "clusterName": name,
            "mode": "enforce",  # the chart's default is audit (issue 30); this test watches it act
            # host network (postrender.py): free ports of the host, and one operator replica (two
            # would want the same port on the one node)
            "replicas": 1,
            "metrics": {"port": process.free_port()},
            "store": {"type": "postgresql", "postgresql": {"urlSecret": {"name": "db"}}},
            "prometheus": {"url": testbed.prometheus_url},
            "extraSettings": {"prometheus": {"matchers": {"case": case}, "label_convention": "pod"}},
            "audit": {"interval": "30s"},
            "policies": {"builtin": False, "files": {"tell.yaml": POLICY}},
            "notifications": {"slack": {"webhookUrlSecret": {"name": "slack"}}},
            "nodeAgent": {
                "enabled": True,
                "port": process.free_port(),
                "podResourcesPath": str(bed_node.pod_resources_dir),
                "serviceMonitor": {"interval": "2s", "scrapeTimeout": "2s"},
            },
        }
        values_file = tmp_path_factory.mktemp("release") / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        devices = deviceplugin.device_ids(bed_node.name, node.FAKE_GPUS)
        post = postrender_args(testbed, devices, TRACE, PHASE)
        helm(testbed, "install", name, str(CHART), "-n", ns, "-f", str(values_file), *post)
        yield Release(
            name=name,
            namespace=ns,
            work_namespace=work_ns,
            lease=f"{name}-gpu-auditor",
            core=core,
            apps=apps,
            coord=k8s.CoordinationV1Api(api),
            slack=slack,
            gpu_pod=pod["metadata"]["name"],
            values=["-f", str(values_file), *post],
            pod_logs=bed_node.pod_logs_dir,
        )
    finally:
        slack.close()
        subprocess.run(
            [testbed.helm, f"--kubeconfig={testbed.kubeconfig}", "uninstall", name, "-n", ns, "--ignore-not-found"],
            capture_output=True,
            timeout=120,
        )
        for n in (ns, work_ns):
            core.delete_namespace(n, grace_period_seconds=0)
        api.close()


def test_operator_pod_runs_non_root_on_a_read_only_root_and_leads(testbed, bed_node, release):
    pods = wait_for(
        "the operator pod Running and Ready",
        lambda: ready_pods(release.core, release.namespace, "operator"),
        explain=lambda: release.explain(testbed),
    )
    (pod,) = pods
    assert pod.spec.node_name == bed_node.name
    status = pod.status.container_statuses[0]
    assert status.image.endswith(f"{bed_node.image_repository}:{bed_node.image_tag}"), status.image

    # seen from the host, on the container's real process: uid 10001 (real, effective, saved,
    # fs) and a read-only root mount
    pid = container_pid(bed_node.state, pod)
    uids = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:"))
    assert uids.split()[1:] == ["10001"] * 4, uids
    root = next(line for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines() if line.split()[4] == "/")
    assert "ro" in root.split()[5].split(","), root

    # the Lease, taken through the pod's own ServiceAccount token (holder: the pod's name)
    wait_for(
        "the pod to hold the Lease",
        lambda: lease_holder(release.coord, release.namespace, release.lease) == pod.metadata.name,
        timeout=60,
    )


def test_one_cycle_in_the_pod_annotates_the_job_and_alerts_slack(testbed, release):
    batch = k8s.BatchV1Api(release.core.api_client)

    def annotated() -> dict | None:
        ann = batch.read_namespaced_job("train", release.work_namespace).metadata.annotations or {}
        return ann if "gpu-auditor.io/verdict" in ann else None

    ann = wait_for("the operator's annotation on the GPU job", annotated, timeout=120)
    assert ann["gpu-auditor.io/verdict"] == "low_sm_efficiency", ann
    pod = release.core.read_namespaced_pod(release.gpu_pod, release.work_namespace)
    assert (pod.metadata.annotations or {}).get("gpu-auditor.io/verdict") == "low_sm_efficiency"
    wait_for("the Slack message at the local receiver", lambda: release.slack.requests, timeout=60)
    (msg,) = release.slack.requests
    assert "train" in msg.body.decode() and release.work_namespace in msg.body.decode(), msg.body[:500]


def test_agent_serves_the_pods_gpu_as_the_kubelet_allocated_it(testbed, bed_node, release):
    (agent,) = wait_for(
        "the node-agent pod Ready",
        lambda: ready_pods(release.core, release.namespace, "node-agent"),
        explain=lambda: release.explain(testbed),
    )
    # the device the kubelet's device manager gave the GPU pod (the plugin's Allocate answer in
    # its container's environment)
    gpu_pod = release.core.read_namespaced_pod(release.gpu_pod, release.work_namespace)
    allocated = process_environ(container_pid(bed_node.state, gpu_pod))["NVIDIA_VISIBLE_DEVICES"]
    port = agent.spec.containers[0].ports[0].container_port

    def attributed() -> list[str] | None:
        text = requests.get(f"http://{agent.status.pod_ip}:{port}/metrics", timeout=10).text
        lines = [ln for ln in text.splitlines() if ln.startswith("DCGM_FI_PROF_SM_ACTIVE{") and 'pod="' in ln]
        return lines or None

    lines = wait_for("pod-attributed series from the agent", attributed, timeout=60)
    (line,) = lines  # one GPU allocated on the node, so one attributed series
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
    assert (labels["namespace"], labels["pod"], labels["container"]) == (
        release.work_namespace,
        release.gpu_pod,
        "main",
    )
    assert labels["UUID"] == allocated, (labels, allocated)
    # the recorded one-SM spin: SM activity near 1/132
    assert float(line.rsplit(" ", 1)[1]) < 0.05, line


def _scrape_config(monitor: dict, service: dict, agent: k8s.V1Pod) -> dict:
    """What the Prometheus Operator makes of the chart's ServiceMonitor for this one agent pod:
    its endpoint's path, interval, timeout and honorLabels, the target being the pod behind the
    Service port the endpoint names (the bed runs no endpoints controller, so it is resolved here)."""
    (ep,) = monitor["spec"]["endpoints"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == ep["port"]]
    (container,) = agent.spec.containers
    (target_port,) = [p.container_port for p in container.ports if p.name == port["targetPort"]]
    return {
        "job_name": f"serviceMonitor/{monitor['metadata']['namespace']}/{monitor['metadata']['name']}/0",
        "metrics_path": ep["path"],
        "honor_labels": ep["honorLabels"],
        "scrape_interval": ep["interval"],
        "scrape_timeout": ep["scrapeTimeout"],
        "static_configs": [{"targets": [f"{agent.status.pod_ip}:{target_port}"]}],
    }


def test_prometheus_scrapes_the_agent_as_the_service_monitor_says(testbed, release, tmp_path):
    (agent,) = ready_pods(release.core, release.namespace, "node-agent")
    custom = k8s.CustomObjectsApi(release.core.api_client)
    name = f"{release.name}-gpu-auditor-node-agent"
    monitor = custom.get_namespaced_custom_object(
        "monitoring.coreos.com", "v1", release.namespace, "servicemonitors", name
    )
    service = release.core.read_namespaced_service(name, release.namespace).to_dict()
    service["spec"]["ports"] = [{"name": p["name"], "targetPort": p["target_port"]} for p in service["spec"]["ports"]]
    scrape = _scrape_config(monitor, service, agent)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": [scrape]}))
    port = process.free_port()
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def scraped() -> list | None:
            try:
                resp = requests.get(
                    f"http://127.0.0.1:{port}/api/v1/query",
                    params={"query": f'DCGM_FI_PROF_SM_ACTIVE{{pod="{release.gpu_pod}"}}'},
                    timeout=5,
                )
            except requests.ConnectionError:
                return None
            return resp.json()["data"]["result"] or None

        (series,) = wait_for("the agent's series in Prometheus", scraped, timeout=60)
    finally:
        prom.terminate()
        prom.wait(timeout=30)
    labels = series["metric"]
    # honorLabels true: the workload's labels as the agent set them, not the scrape target's
    assert (labels["namespace"], labels["pod"], labels["container"]) == (
        release.work_namespace,
        release.gpu_pod,
        "main",
    )
    assert labels["job"] == scrape["job_name"] and labels["source"] == "gpu-auditor-agent", labels


def test_deleting_the_operator_pod_hands_the_lease_to_its_replacement(testbed, release):
    (pod,) = ready_pods(release.core, release.namespace, "operator")
    release.core.delete_namespaced_pod(pod.metadata.name, release.namespace, grace_period_seconds=5)

    def successor() -> k8s.V1Pod | None:
        fresh = [
            p for p in ready_pods(release.core, release.namespace, "operator") if p.metadata.name != pod.metadata.name
        ]
        return fresh[0] if fresh else None

    new = wait_for("a replacement operator pod Ready", successor, explain=lambda: release.explain(testbed))
    wait_for(
        "the replacement to take the Lease",
        lambda: lease_holder(release.coord, release.namespace, release.lease) == new.metadata.name,
        timeout=60,
    )


#: What `kubectl get` lists of a release after uninstall: every kind the chart renders, and the
#: ones its controllers make.
RELEASE_KINDS = (
    "deployments,replicasets,daemonsets,controllerrevisions,pods,services,serviceaccounts,configmaps,secrets,"
    "roles,rolebindings,networkpolicies,poddisruptionbudgets,servicemonitors,clusterroles,clusterrolebindings,"
    "validatingadmissionpolicies,validatingadmissionpolicybindings"
)


def test_upgrade_rolls_the_operator_and_uninstall_leaves_nothing(testbed, release):
    (before,) = ready_pods(release.core, release.namespace, "operator")
    # a settings change rolls the pod (checksum annotation); a new port, since the old pod holds
    # its host port until the new one is Ready (maxUnavailable 0)
    helm(
        testbed,
        "upgrade",
        release.name,
        str(CHART),
        "-n",
        release.namespace,
        *release.values,
        "--set",
        f"metrics.port={process.free_port()}",
        "--set-string",
        "logLevel=debug",
    )

    def rolled() -> k8s.V1Pod | None:
        pods = release.core.list_namespaced_pod(
            release.namespace, label_selector="app.kubernetes.io/component=operator"
        ).items
        ready = ready_pods(release.core, release.namespace, "operator")
        return ready[0] if len(pods) == 1 and ready and ready[0].metadata.name != before.metadata.name else None

    wait_for("the upgraded operator pod Ready, the old one gone", rolled, explain=lambda: release.explain(testbed))

    t0 = time.monotonic()
    helm(testbed, "uninstall", release.name, "-n", release.namespace, "--wait", "--timeout=120s")
    print(f"node tests: helm uninstall --wait: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    selector = f"app.kubernetes.io/instance={release.name}"
    kubectl = [testbed.kubectl, f"--kubeconfig={testbed.kubeconfig}", "get", RELEASE_KINDS, "-A", "-l", selector]

    def nothing_left() -> bool:
        proc = subprocess.run([*kubectl, "-o", "name"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return not proc.stdout.strip()

    wait_for("nothing of the release left", nothing_left, timeout=60, explain=lambda: release.explain(testbed))
    assert not release.core.list_namespaced_pod(release.namespace).items
    assert helm(testbed, "list", "-n", release.namespace, "-q").strip() == ""
