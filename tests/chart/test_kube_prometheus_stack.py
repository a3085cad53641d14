"""kube-prometheus-stack out of the box (issue 29, part 4).

kube-prometheus-stack's Prometheus selects ServiceMonitors and PrometheusRules by the label
``release: <its Helm release name>`` and ignores everything else without a word; its Grafana
sidecar loads dashboards labelled ``grafana_dashboard: "1"``. Upstream, prometheus-community/helm-charts
@ cf408a29 (chart 88.5.3): charts/kube-prometheus-stack/values.yaml (``serviceMonitorSelectorNilUsesHelmValues:
true``, ``ruleSelectorNilUsesHelmValues: true``, both selectors ``{}``, namespace selectors ``{}``;
``grafana.sidecar.dashboards.label: grafana_dashboard``, ``labelValue: "1"``) and
templates/prometheus/prometheus.yaml (a nil/empty selector with NilUsesHelmValues true renders
``matchLabels: {release: <Release.Name>}``).

The render tests check our chart's labels. The operator test runs the real Prometheus Operator
(auditor/testbed/promoperator.py) against the bed's apiserver with a Prometheus object carrying
exactly those selectors, reads what it generated (Secret ``prometheus-<name>``, ConfigMaps
``prometheus-<name>-rulefiles-<i>``), and runs the real Prometheus on it: our rules load, our
ServiceMonitor's job scrapes the operator's real ``/metrics`` endpoint; a release without the
label is not selected at all.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import requests
import yaml
from chartlib import Chart, find

from auditor.operator_loop.health import HealthServer, OperatorMetrics
from auditor.testbed import promoperator

pytestmark = pytest.mark.testbed

#: kube-prometheus-stack's defaults (module docstring gives the upstream lines)
KPS_RELEASE = "kube-prometheus-stack"
KPS_PROMETHEUS = f"{KPS_RELEASE}-prometheus"  # its Prometheus object: <fullname>-prometheus
GRAFANA_LABEL = ("grafana_dashboard", "1")
ALL = [
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "grafanaDashboard.enabled=true",
    "nodeAgent.enabled=true",
    "nodeAgent.serviceMonitor.enabled=true",
]


def _labels(objs: list[dict], kind: str) -> list[dict]:
    found = find(objs, kind)
    assert found, kind
    return [o["metadata"]["labels"] for o in found]


def test_default_labels_are_the_ones_kube_prometheus_stack_selects_by(chart: Chart):
    objs = chart.render(sets=ALL)
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert [lbl.get("release") for lbl in _labels(objs, kind)] == [KPS_RELEASE] * len(find(objs, kind))
    assert len(find(objs, "ServiceMonitor")) == 2  # the operator's and the node agents'
    (dashboard,) = [o for o in find(objs, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert dashboard["metadata"]["labels"][GRAFANA_LABEL[0]] == GRAFANA_LABEL[1]


def test_release_follows_the_value_and_an_explicit_label_wins(chart: Chart):
    objs = chart.render(sets=[*ALL, "kubePrometheusStack.release=prom", "prometheusRule.labels.release=rules"])
    assert {lbl["release"] for lbl in _labels(objs, "ServiceMonitor")} == {"prom"}
    assert [lbl["release"] for lbl in _labels(objs, "PrometheusRule")] == ["rules"]
    objs = chart.render(sets=[*ALL, "kubePrometheusStack.release="])
    assert all("release" not in lbl for k in ("ServiceMonitor", "PrometheusRule") for lbl in _labels(objs, k))


def test_a_release_name_that_is_no_label_value_is_refused(chart: Chart):
    res = chart.template_text(sets=[*ALL, "kubePrometheusStack.release=my release"], check=False)
    assert res.rc != 0 and "kubePrometheusStack" in res.err


# --- the real Prometheus Operator ------------------------------------------------------------


def _host_ip() -> str:
    """This host's address on its network (an EndpointSlice may not hold a loopback address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.254", 9))  # no packet is sent: only picks the outgoing interface
        return str(s.getsockname()[0])


def _apply(chart: Chart, docs: list[dict]) -> None:
    chart.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(docs))


def _prometheus_object(namespace: str) -> dict:
    """A Prometheus object as kube-prometheus-stack renders it by default, as far as selection
    goes. Two differences, both outside selection: ``version`` is the installed binary's (the
    operator writes a configuration for that version), and ``replicas: 0`` (no pod: no images here).
    ``serviceDiscoveryRole: EndpointSlice``: so the test's hand-made EndpointSlice is what
    discovery reads (kube-prometheus-stack leaves the operator's default, Endpoints)."""
    selects = {"matchLabels": {"release": KPS_RELEASE}}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": KPS_PROMETHEUS, "namespace": namespace, "labels": {"release": KPS_RELEASE}},
        "spec": {
            "version": _prometheus_version(),
            "replicas": 0,
            "serviceDiscoveryRole": "EndpointSlice",
            "serviceMonitorSelector": selects,
            "serviceMonitorNamespaceSelector": {},
            "podMonitorSelector": selects,
            "podMonitorNamespaceSelector": {},
            "probeSelector": selects,
            "ruleSelector": selects,
            "ruleNamespaceSelector": {},
            "scrapeInterval": "30s",
            "evaluationInterval": "30s",
        },
    }


def _prometheus_version() -> str:
    out = subprocess.run(["prometheus", "--version"], capture_output=True, text=True, check=True).stdout
    return "v" + out.split()[2].split("+")[0]  # "prometheus, version 2.42.0+ds (...)"


def _wait(what: str, probe, timeout: float = 90.0, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def operator_bits(testbed, tmp_path_factory):
    """The operator binary (built on first use: the build time is printed) and its CRDs applied."""
    logs = tmp_path_factory.mktemp("prometheus-operator")
    t0 = time.monotonic()
    binary, built = promoperator.build(logs / "build.log")
    crds = promoperator.crd_files()
    chart = Chart(helm_bin=str(testbed.helm), kubectl_bin=str(testbed.kubectl), kubeconfig=str(testbed.kubeconfig))
    for crd in crds:
        chart.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    for crd in crds:
        group, plural = crd.stem.split("_")  # monitoring.coreos.com_servicemonitors
        chart.kubectl("wait", "--for=condition=Established", f"crd/{plural}.{group}", "--timeout=60s")
    print(
        f"prometheus-operator {promoperator.VERSION}: build {built:.0f} s (0 = cached), ready {time.monotonic() - t0:.1f} s"
    )
    return binary, logs


# a cold build of the operator (no cached binary, cold Go build cache) took 18 min on this project's
# loaded 2-core machine, beyond the suite's 600 s default; cached it costs nothing
@pytest.mark.timeout(2400)
def test_the_real_operator_selects_ours_and_prometheus_loads_and_scrapes_them(
    chart: Chart, testbed, operator_bits, tmp_path
):
    binary, logs = operator_bits
    t0 = time.monotonic()
    ns = f"kps-{uuid.uuid4().hex[:8]}"
    chart.kubectl("create", "namespace", ns)
    metrics = OperatorMetrics()
    metrics.leader.set(1)
    server = HealthServer(_host_ip(), 0, metrics=metrics, healthy=lambda: (True, ""), ready=lambda: (True, ""))
    server.start()
    op = prom = None
    try:
        # ours with kube-prometheus-stack's label (the default) and a second release without it
        wanted = {"Service", "ServiceMonitor", "PrometheusRule"}
        fast = ["serviceMonitor.interval=2s", "serviceMonitor.scrapeTimeout=1s"]
        for release, extra in (("ga", []), ("bare", ["kubePrometheusStack.release="])):
            objs = chart.render(namespace=ns, release=release, sets=[*ALL, *fast, *extra])
            _apply(chart, [o for o in objs if o["kind"] in wanted])
        # the operator Service's endpoint: this process's real /metrics (no pod runs here)
        _apply(
            chart,
            [
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {
                        "name": "ga-gpu-auditor-test",
                        "namespace": ns,
                        "labels": {
                            "kubernetes.io/service-name": "ga-gpu-auditor",
                            "endpointslice.kubernetes.io/managed-by": "gpu-auditor-tests",
                        },
                    },
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": [server.server.server_address[0]], "conditions": {"ready": True}}],
                    "ports": [{"name": "http", "port": server.port, "protocol": "TCP"}],
                },
                _prometheus_object(ns),
            ],
        )
        op = promoperator.start(binary, Path(testbed.kubeconfig), [ns], logs / f"operator-{ns}.log")

        # what the operator generated: our jobs and rules, not the unlabelled release's
        def generated():
            text = promoperator.generated_config(Path(testbed.kubectl), Path(testbed.kubeconfig), ns, KPS_PROMETHEUS)
            rules = promoperator.rule_files(Path(testbed.kubectl), Path(testbed.kubeconfig), ns, KPS_PROMETHEUS)
            return (text, rules) if text and "ga-gpu-auditor" in text and rules else None

        text, rules = _wait(f"Secret prometheus-{KPS_PROMETHEUS} with our jobs (log: {op.log})", generated)
        generated_s = time.monotonic() - t0
        jobs = [j["job_name"] for j in yaml.safe_load(text)["scrape_configs"]]
        assert sorted(jobs) == [
            f"serviceMonitor/{ns}/ga-gpu-auditor-node-agent/0",
            f"serviceMonitor/{ns}/ga-gpu-auditor/0",
        ]
        assert "bare-gpu-auditor" not in text  # bare's ServiceMonitors (no release label) are not selected
        assert [n for n in rules if "ga-gpu-auditor" in n] == list(rules)  # nor its PrometheusRule
        assert len(rules) == 1 and "gpu-auditor.efficiency.5m" in next(iter(rules.values()))

        # the rule files through promtool and a real Prometheus
        rules_dir = tmp_path / "rules"
        rules_dir.mkdir()
        for name, body in rules.items():
            (rules_dir / name).write_text(body)
        check = subprocess.run(
            [testbed.promtool, "check", "rules", *map(str, rules_dir.iterdir())], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr
        config_file = tmp_path / "prometheus.yml"
        config_file.write_text(
            promoperator.localize_config(
                text, KPS_PROMETHEUS, Path(testbed.kubectl), Path(testbed.kubeconfig), tmp_path
            )
        )
        prom = promoperator.run_prometheus(Path("/usr/bin/prometheus"), config_file, tmp_path)

        groups = requests.get(f"{prom.url}/api/v1/rules", timeout=5).json()["data"]["groups"]
        assert {g["name"] for g in groups} == {"gpu-auditor.efficiency.5m", "gpu-auditor.alerts"}
        assert all(r["health"] != "err" for g in groups for r in g["rules"])

        def scraped():
            res = requests.get(
                f"{prom.url}/api/v1/query", params={"query": f'gpu_auditor_leader{{namespace="{ns}"}}'}, timeout=5
            ).json()["data"]["result"]
            return res or None

        (series,) = _wait("a scrape of our /metrics through the ServiceMonitor's job", scraped, timeout=60)
        assert series["metric"]["job"] == "ga-gpu-auditor" and series["value"][1] == "1"
        # the labels our GpuAuditorDown alert selects by (up{job=<fullname>, namespace=<ns>}) are the ones it gets
        up = requests.get(
            f"{prom.url}/api/v1/query", params={"query": f'up{{job="ga-gpu-auditor",namespace="{ns}"}} == 1'}, timeout=5
        ).json()["data"]["result"]
        assert len(up) == 1
        print(
            json.dumps(
                {"generated_s": round(generated_s, 1), "scraped_s": round(time.monotonic() - t0, 1), "jobs": jobs}
            )
        )
    finally:
        if prom:
            prom.stop()
        if op:
            op.stop()
        server.stop()
        chart.kubectl("delete", "namespace", ns, "--wait=false", check=False)
