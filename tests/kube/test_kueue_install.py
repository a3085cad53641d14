"""Which Kueue runs and what still works of the chosen options (issue 29): the pure part.

The Deployment and ConfigMap below have the shapes upstream ships (Kueue v0.19.2's Helm chart
``charts/kueue``: label ``app.kubernetes.io/version``, ``--feature-gates=A=true`` in the manager's
args; its kustomize manifests: the image tag, ``featureGates`` in ``kueue-manager-config``);
tests/testbed/test_kueue_versions.py renders the real chart and reads it back through the bed's
apiserver.
"""

from __future__ import annotations

import pytest

from auditor.kube.kueue_features import (
    ADMISSION_GATED_BY_GATE,
    OFF,
    ON,
    PRIORITY_BOOST_GATE,
    UNKNOWN,
    GateProbe,
    KueueInstall,
    feature_lines,
    gate_default,
    install_from,
    needed_gates,
    parse_version,
)

BOTH = (PRIORITY_BOOST_GATE, ADMISSION_GATED_BY_GATE)


def _deployment(image: str, *, labels: dict | None = None, args: list[str] | None = None) -> dict:
    return {
        "metadata": {"name": "kueue-controller-manager", "labels": labels or {}},
        "spec": {"template": {"spec": {"containers": [{"name": "manager", "image": image, "args": args or []}]}}},
    }


def _configmap(gates: dict | None) -> dict:
    body = "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"
    if gates is not None:
        body += "featureGates:\n" + "".join(f"  {k}: {str(v).lower()}\n" for k, v in gates.items())
    return {"metadata": {"name": "kueue-manager-config"}, "data": {"controller_manager_config.yaml": body}}


@pytest.mark.parametrize(
    "text, want",
    [("v0.19.2", (0, 19, 2)), ("0.17.0", (0, 17, 0)), ("v0.20.0-rc.1", (0, 20, 0)), ("main", None), (None, None)],
)
def test_versions_are_read_from_tags_and_labels(text, want):
    assert parse_version(text) == want


def test_gate_defaults_follow_upstreams_feature_table():
    assert gate_default(PRIORITY_BOOST_GATE, (0, 17, 0)) == (False, "alpha")
    assert gate_default(PRIORITY_BOOST_GATE, (0, 19, 2)) == (False, "alpha")
    assert gate_default(ADMISSION_GATED_BY_GATE, (0, 17, 0)) == (False, "alpha")
    assert gate_default(ADMISSION_GATED_BY_GATE, (0, 19, 2)) == (True, "beta")
    assert gate_default(ADMISSION_GATED_BY_GATE, (0, 16, 3)) is None


def test_the_helm_charts_label_and_flag_win_over_the_image_tag_and_configmap():
    dep = _deployment(
        "us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue:release-0.19",
        labels={"app.kubernetes.io/version": "v0.19.2"},
        args=["--config=/controller_manager_config.yaml", "--feature-gates=PriorityBoost=true,AdmissionGatedBy=false"],
    )
    got = install_from(dep, _configmap({"PriorityBoost": False}), "kueue-system")
    assert got.version == "v0.19.2" and "app.kubernetes.io/version" in got.version_from
    assert got.gates == {PRIORITY_BOOST_GATE: True, ADMISSION_GATED_BY_GATE: False}
    assert "--feature-gates" in got.gates_from


def test_kustomize_install_image_tag_and_configmap_gates():
    got = install_from(
        _deployment("registry.k8s.io/kueue/kueue:v0.17.0@sha256:abc"), _configmap({"AdmissionGatedBy": True}), "ks"
    )
    assert got.version == "v0.17.0" and "image registry.k8s.io/kueue/kueue:v0.17.0" in got.version_from
    assert got.gates == {ADMISSION_GATED_BY_GATE: True} and "ConfigMap ks/kueue-manager-config" in got.gates_from


def test_nothing_readable_is_unknown_not_an_error():
    got = install_from(None, None, "kueue-system")
    assert got.version is None and got.gates == {}
    lines = feature_lines(got, BOTH)
    assert [(x.level, x.subject) for x in lines] == [
        ("info", "Kueue version"),
        ("info", "Kueue PriorityBoost gate"),
        ("info", "Kueue AdmissionGatedBy gate"),
    ]
    assert lines[1].text.startswith("unknown") and "lowerPriorityBy" in lines[1].text


def test_a_stock_v0_17_leaves_both_gates_off_and_says_what_stops_working():
    stock = KueueInstall(
        "v0.17.0", "image x:v0.17.0", {}, "featureGates of ConfigMap kueue-system/kueue-manager-config"
    )
    lines = {x.subject: x for x in feature_lines(stock, BOTH)}
    assert lines["Kueue version"].level == "ok"
    boost, gated = lines["Kueue PriorityBoost gate"], lines["Kueue AdmissionGatedBy gate"]
    assert (boost.level, gated.level) == ("warn", "warn")
    assert "alpha in v0.17.0" in boost.text and "Kueue ignores" in boost.text
    assert "v0.17.0's default" in gated.text and "holdBeforeQuota" in gated.text


def test_v0_19_turns_admission_gated_by_on_by_default_and_priority_boost_stays_alpha():
    stock = KueueInstall("v0.19.2", "label", {}, "ConfigMap")
    lines = {x.subject: x for x in feature_lines(stock, BOTH)}
    assert lines["Kueue AdmissionGatedBy gate"].level == "ok"
    assert "beta in v0.19.2" in lines["Kueue AdmissionGatedBy gate"].text
    assert lines["Kueue PriorityBoost gate"].level == "warn"
    on = KueueInstall("v0.19.2", "label", {PRIORITY_BOOST_GATE: True}, "--feature-gates")
    boost = next(x for x in feature_lines(on, (PRIORITY_BOOST_GATE,)) if x.subject == "Kueue PriorityBoost gate")
    assert boost.level == "ok" and "alpha" in boost.text and "#13414" in boost.text


def test_the_webhook_probe_decides_priority_boost_over_the_configuration():
    configured_off = KueueInstall("v0.19.2", "label", {PRIORITY_BOOST_GATE: False}, "ConfigMap")
    probe = GateProbe(ON, "Kueue's webhook refused a non-integer kueue.x-k8s.io/priority-boost")
    line = feature_lines(configured_off, (PRIORITY_BOOST_GATE,), probe)[1]
    assert line.level == "ok" and "webhook refused" in line.text
    unknown = feature_lines(configured_off, (PRIORITY_BOOST_GATE,), GateProbe(UNKNOWN, "no Workload"))[1]
    assert unknown.level == "warn" and "set in ConfigMap" in unknown.text
    off = feature_lines(KueueInstall(None, "none", {}, "none"), (PRIORITY_BOOST_GATE,), GateProbe(OFF, "accepted"))[1]
    assert off.level == "warn" and "accepted" in off.text


def test_versions_outside_the_tested_range_are_said():
    old = feature_lines(KueueInstall("v0.16.4", "image", {}, "cm"), ())[0]
    assert old.level == "warn" and "older than gpu-auditor's floor v0.17.0" in old.text
    new = feature_lines(KueueInstall("v0.21.0", "image", {}, "cm"), ())[0]
    assert new.level == "info" and "tested on v0.17.0 and v0.19.2" in new.text


def test_only_the_chosen_options_gates_are_needed():
    assert needed_gates(lower_priority=False, hold_before_quota=False) == ()
    assert needed_gates(lower_priority=True, hold_before_quota=True) == BOTH
    assert needed_gates(lower_priority=False, hold_before_quota=True) == (ADMISSION_GATED_BY_GATE,)
