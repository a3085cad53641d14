"""The console's Ingress routes the gate's acknowledgement links (issue 29, part 5).

Alerts link to ``<gate.ackLinks.baseUrl>/gate/ack?...`` (auditor/core/acklink.py) and the form that
page shows posts to ``/gate/ack`` on the same host (auditor/operator_loop/ack_endpoint.py); both are
served by the operator's HTTP port, the Service's ``http``. With ack links on (``gate.enabled`` and
``gate.ackLinks.keySecret.name``) the Ingress carries that one path besides ``/console``; without
them it routes ``/console`` alone. The rendered Ingress is then applied to the bed's real
kube-apiserver (a server-side dry run: its validation of networking.k8s.io/v1 runs, nothing is
stored).
"""

from __future__ import annotations

import pytest
import yaml
from chartlib import Chart, find

INGRESS = ["console.ingress.enabled=true", "console.ingress.host=gpu.example.com"]
ACK = ["gate.enabled=true", "gate.ackLinks.keySecret.name=gpu-auditor-ack-key"]
BACKEND = {"service": {"name": "ga-gpu-auditor", "port": {"name": "http"}}}


def paths(objs: list[dict]) -> dict[str, tuple[str, dict]]:
    (ing,) = find(objs, "Ingress", "ga-gpu-auditor-console")
    (rule,) = ing["spec"]["rules"]
    return {p["path"]: (p["pathType"], p["backend"]) for p in rule["http"]["paths"]}


def test_ack_links_on_route_gate_ack_to_the_operators_http_port(chart: Chart) -> None:
    objs = chart.render(sets=INGRESS + ACK + ["gate.ackLinks.baseUrl=https://gpu.example.com"])
    assert paths(objs) == {"/console": ("Prefix", BACKEND), "/gate/ack": ("Exact", BACKEND)}
    (svc,) = find(objs, "Service", "ga-gpu-auditor")
    (dep,) = find(objs, "Deployment")
    (port,) = [p for p in svc["spec"]["ports"] if p["name"] == "http"]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert port["targetPort"] == "http" and "http" in [p["name"] for p in container["ports"]]


@pytest.mark.parametrize(
    "sets",
    [INGRESS, INGRESS + ["gate.enabled=true"], INGRESS + ["gate.ackLinks.keySecret.name=gpu-auditor-ack-key"]],
    ids=["gate-off", "gate-without-key", "key-without-gate"],
)
def test_without_ack_links_only_console_is_routed(chart: Chart, sets: list[str]) -> None:
    assert list(paths(chart.render(sets=sets))) == ["/console"]


@pytest.mark.testbed
def test_the_apiserver_accepts_the_ingress_with_gate_ack(chart: Chart, namespace: str) -> None:
    text = chart.template_text(namespace=namespace, release=namespace, sets=INGRESS + ACK).out
    (ing,) = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "Ingress"]
    res = chart.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(ing))
    assert res.out.strip().endswith("created (server dry run)"), res.out + res.err
