"""The chart on a real kube-apiserver of its floor version (issue 29): Chart.yaml's kubeVersion is
true only if the chart installs there.

The floor apiserver (auditor/testbed/floor.py: v1.30.14 built from the Go module proxy, cached,
with an etcd on its own ports and directory, stopped after the module) takes the real `helm
install` of the default chart (helm reads the server's version and discovery, so the chart's own
floor checks run as on a user's cluster), a server-side apply of the full values' render, and
proves the write fence's CEL is enforced there. What needs a newer version is refused by name.
The current version (1.36) is the test bed's apiserver: tests/chart/test_apiserver.py.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest
import yaml
from chartlib import CHART, FULL_VALUES, Chart, Result, ServiceAccount

from auditor.testbed import binaries, config, floor

pytestmark = pytest.mark.testbed

NS = "gpu-auditor"


@pytest.fixture(scope="module")
def floor_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[floor.FloorServer]:
    server = floor.up(tmp_path_factory.mktemp("floor-apiserver"), owner_pid=os.getpid())
    try:
        yield server
    finally:
        floor.down(server)


@pytest.fixture(scope="module")
def on_floor(floor_server: floor.FloorServer) -> Chart:
    bins = binaries.locate()
    chart = Chart(helm_bin=str(bins.helm), kubectl_bin=str(bins.kubectl), kubeconfig=str(floor_server.kubeconfig))
    chart.kubectl("create", "namespace", NS)
    return chart


def _wait_for(probe: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Policies and bindings reach the admission chain through informers: poll, never sleep blind."""
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.5)


def _establish(chart: Chart, crds: list[Path]) -> None:
    """Apply CRDs server-side and wait until each is Established (`kubectl wait` fails outright on a
    CRD whose status has no conditions yet, so poll)."""
    for path in crds:
        chart.kubectl("apply", "--server-side", "-f", str(path))
    query = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'
    for path in crds:
        name = yaml.safe_load(path.read_text())["metadata"]["name"]

        def established(name: str = name) -> bool:
            return chart.kubectl("get", "crd", name, "-o", query).out == "True"

        _wait_for(established, f"CRD {name} Established", timeout=60)


def test_the_floor_server_is_chart_yamls_floor(on_floor: Chart, floor_server: floor.FloorServer):
    got = json.loads(on_floor.kubectl("get", "--raw", "/version").out)["gitVersion"]
    assert got == f"v{floor.FLOOR_K8S_VERSION}" == f"v{floor_server.version}"
    kube_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    assert kube_version == f">={floor.FLOOR_K8S_VERSION.rsplit('.', 1)[0]}.0-0", kube_version
    assert floor.apiserver_path().is_relative_to(config.cache_dir())


def test_the_full_render_is_applied_server_side(on_floor: Chart, floor_server: floor.FloorServer):
    """Every object of the full values (ServiceMonitor and PrometheusRule too: their CRDs from the
    Prometheus Operator's module, as the bed has them) is created by a real server-side apply."""
    crds = [p for p in binaries.crd_files() if "prometheus-operator" in str(p)]
    _establish(on_floor, [*crds, CHART / "crds" / "gateholds.gpu-auditor.io.yaml"])
    text = on_floor.helm(
        "template", "full", str(CHART), "-n", NS, "-f", str(FULL_VALUES), "--kube-version", floor_server.version
    ).out
    objs = [d for d in yaml.safe_load_all(text) if d]
    res = on_floor.kubectl("apply", "--server-side", "--field-manager=floor-test", "-n", NS, "-f", "-", input=text)
    applied = [line for line in res.out.splitlines() if line.endswith("serverside-applied")]
    assert len(applied) == len(objs), res.out + res.err
    kinds = {o["kind"] for o in objs}
    assert {"ValidatingAdmissionPolicy", "ServiceMonitor", "PrometheusRule", "DaemonSet"} <= kinds, kinds
    on_floor.kubectl("delete", "-n", NS, "-f", "-", "--wait=false", input=text)


def test_helm_installs_the_default_chart_and_the_fence_holds(on_floor: Chart, floor_server: floor.FloorServer):
    """`helm install` of the defaults (the write fence on) succeeds against the 1.30 server, and its
    ValidatingAdmissionPolicy is enforced: the ServiceAccount may annotate a pod, not label it."""
    notes = on_floor.helm("install", "ga", str(CHART), "-n", NS).out
    assert "STATUS: deployed" in notes, notes
    status = json.loads(on_floor.helm("status", "ga", "-n", NS, "-o", "json").out)
    assert status["info"]["status"] == "deployed"
    on_floor.kubectl("get", "validatingadmissionpolicy", "ga-gpu-auditor-write-fence")

    on_floor.kubectl("run", "probe", "-n", NS, "--image=busybox", "--restart=Never")
    sa = ServiceAccount(on_floor, NS, "ga-gpu-auditor", api_client=None)
    fence = "ValidatingAdmissionPolicy 'ga-gpu-auditor-write-fence'"

    def label() -> Result:  # a new value each time: a label the fence let through early is changed again
        value = f"x={time.monotonic_ns()}"
        return on_floor.kubectl("label", "pod", "probe", "-n", NS, value, "--overwrite", *sa.as_args, check=False)

    _wait_for(lambda: fence in label().err, "the fence denies the ServiceAccount a label")
    sa.run("annotate", "pod", "probe", "-n", NS, "gpu-auditor.io/verdict=low_sm_efficiency")
    on_floor.helm("uninstall", "ga", "-n", NS)


def test_the_gate_and_requeue_install_on_the_floor(on_floor: Chart):
    """The gate without holds (an AdmissionCheck, the probation class) and requeue (the fence's
    Job and Workload rules) need nothing newer: with the bed's Kueue CRDs they install on 1.30."""
    _establish(on_floor, [p for p in binaries.crd_files() if "kueue" in p.parent.name])
    on_floor.helm(
        "install", "gated", str(CHART), "-n", NS, "--set", "gate.enabled=true", "--set", "requeue.enabled=true"
    )
    on_floor.kubectl("get", "admissionchecks.kueue.x-k8s.io", "gpu-efficiency")
    on_floor.kubectl("get", "validatingadmissionpolicy", "gated-gpu-auditor-write-fence")
    on_floor.helm("uninstall", "gated", "-n", NS)


def test_hold_before_quota_is_refused_by_name(on_floor: Chart, floor_server: floor.FloorServer):
    """MutatingAdmissionPolicy v1 is 1.36's (the floor server serves no such kind): helm, told the
    server's version, refuses the value."""
    served = on_floor.kubectl("api-resources", "--api-group=admissionregistration.k8s.io", "-o", "name").out.split()
    assert "validatingadmissionpolicies.admissionregistration.k8s.io" in served
    assert "mutatingadmissionpolicies.admissionregistration.k8s.io" not in served, served
    sets = ["--set", "gate.enabled=true", "--set", "gate.holdBeforeQuota.enabled=true"]
    res = on_floor.helm("install", "refused", str(CHART), "-n", NS, *sets, check=False)
    needs = "gate.holdBeforeQuota.enabled=true needs Kubernetes >= 1.36"
    assert res.rc != 0 and needs in res.err and f"this cluster is v{floor_server.version}" in res.err, res.err
    listed = on_floor.helm("list", "-n", NS, "-q").out.split()
    assert "refused" not in listed


def test_the_floor_binary_is_cached_by_version(floor_server: floor.FloorServer):
    """A second build is a no-op: the binary sits in the cache under its version."""
    path = floor.build(floor_server.version)
    assert path == floor.apiserver_path(floor_server.version) and re.search(r"kube-apiserver-v1\.30\.\d+", str(path))
    assert Path(path).stat().st_size > 0
