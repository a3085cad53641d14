"""The chart's Kubernetes version floors (issue 29), rendered by the test bed's real helm at, below
and above each one: Chart.yaml's kubeVersion for the chart as a whole, templates/_versions.tpl
for each optional part. A refusal names the value that switches the part on, the version it
needs and the cluster's. Where helm's API list came from the apiserver (it names kinds, as on
install), a part whose API the cluster does not serve is refused too; `--api-versions` stands in
for that discovery here. docs/install.md's "Version floors" table must say the same.
The floors on real servers: test_floor_apiserver.py (1.30) and the bed's apiserver (1.36).
"""

from __future__ import annotations

import re
from typing import Sequence

import pytest
import yaml
from chartlib import CHART, Chart, Result, find

from auditor.testbed.floor import FLOOR_K8S_VERSION

pytestmark = pytest.mark.testbed

HOLD = ["gate.enabled=true", "gate.holdBeforeQuota.enabled=true"]
VAP = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
MAP = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
DOCS = CHART.parents[1] / "docs" / "install.md"


def template(chart: Chart, kube: str, sets: Sequence[str] = (), api_versions: Sequence[str] = ()) -> Result:
    args = ["template", "ga", str(CHART), "--kube-version", kube, *(a for s in sets for a in ("--set", s))]
    args += [a for api in api_versions for a in ("--api-versions", api)]
    return chart.helm(*args, check=False)


def kinds(text: str) -> set[str]:
    return {d["kind"] for d in yaml.safe_load_all(text) if d}


def floors() -> dict[str, dict]:
    """The floors table of templates/_versions.tpl (the `gpu-auditor.floors` define)."""
    text = (CHART / "templates" / "_versions.tpl").read_text()
    body = re.search(r'define "gpu-auditor\.floors" -}}\n(.*?){{- end }}', text, re.S)
    assert body, "no gpu-auditor.floors define"
    return yaml.safe_load(body.group(1))


def test_chart_yaml_floor_is_the_tested_one():
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"] == ">=1.30.0-0"
    assert FLOOR_K8S_VERSION.startswith("1.30.")
    assert floors()["writeFence"]["minor"] == 30 and floors()["holdBeforeQuota"]["minor"] == 36


@pytest.mark.parametrize("kube", ["1.30.0", FLOOR_K8S_VERSION, "1.33.5", "1.36.3", "1.37.0"])
def test_the_default_chart_renders_from_the_floor_up(chart: Chart, kube: str):
    res = template(chart, kube)
    assert res.rc == 0, res.err
    assert "ValidatingAdmissionPolicy" in kinds(res.out)  # the write fence is on by default


@pytest.mark.parametrize("kube", ["1.29.15", "1.27.0"])
def test_below_the_floor_the_chart_is_refused(chart: Chart, kube: str):
    for sets in ([], ["rbac.writeFence.enabled=false"]):
        res = template(chart, kube, sets)
        assert (
            res.rc != 0
            and f"chart requires kubeVersion: >=1.30.0-0 which is incompatible with Kubernetes v{kube}" in res.err
        ), res.err


@pytest.mark.parametrize("kube", ["1.34.0", "1.35.4"])
def test_hold_before_quota_below_136_names_value_and_versions(chart: Chart, kube: str):
    res = template(chart, kube, HOLD)
    assert res.rc != 0, res.out
    assert (
        f"gate.holdBeforeQuota.enabled=true needs Kubernetes >= 1.36 (MutatingAdmissionPolicy v1; 1.34 and 1.35 "
        f"serve only v1beta1, and only when switched on); this cluster is v{kube}. Upgrade the cluster, or set it "
        "false to hold through the AdmissionCheck alone"
    ) in res.err, res.err
    assert template(chart, kube, [*HOLD, "gate.holdBeforeQuota.enabled=false"]).rc == 0


@pytest.mark.parametrize("kube", ["1.36.0", "1.37.0"])
def test_hold_before_quota_from_136_renders_the_v1_policy(chart: Chart, kube: str):
    res = template(chart, kube, HOLD)
    assert res.rc == 0, res.err
    objs = [d for d in yaml.safe_load_all(res.out) if d]
    (policy,) = find(objs, "MutatingAdmissionPolicy")
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"


def test_an_api_the_cluster_does_not_serve_is_refused_when_discovered(chart: Chart):
    """Discovery (kinds listed) without the policy kinds: a 1.36 cluster with them switched off."""
    res = template(chart, "1.36.3", HOLD, ["v1/Pod"])
    assert (
        res.rc != 0
        and f"rbac.writeFence.enabled=true needs {VAP}, which this cluster (v1.36.3) does not serve" in res.err
    )
    res = template(chart, "1.36.3", HOLD, ["v1/Pod", VAP])
    assert res.rc != 0 and f"gate.holdBeforeQuota.enabled=true needs {MAP}, which this cluster (v1.36.3)" in res.err
    assert template(chart, "1.36.3", HOLD, ["v1/Pod", VAP, MAP]).rc == 0
    # helm template's own list names group-versions only: no claim about what a cluster serves
    assert template(chart, "1.36.3", HOLD).rc == 0


def test_docs_state_the_same_floors():
    """docs/install.md's "Version floors" table lists each floor the chart enforces."""
    text = DOCS.read_text()
    section = re.search(r"^#{2,3} Version floors\n(.*?)(?=^#{2,3} |\Z)", text, re.S | re.M)
    assert section, "docs/install.md has no Version floors section"
    body = section.group(1)
    assert re.search(r"\|\s*the chart \(defaults\)\s*\|\s*1\.30\s*\|", body), body
    for f in floors().values():
        value = f["value"].split("=")[0]
        assert re.search(rf"\|\s*`{re.escape(value)}`[^|]*\|\s*1\.{f['minor']}\s*\|", body), (value, body)
