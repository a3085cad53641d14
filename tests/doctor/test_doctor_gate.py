"""doctor's gate lines on fixed Kueue objects (JSON as the API returns it, field names from
upstream's apis/kueue/v1beta2 admissioncheck_types.go and clusterqueue_types.go); the same lines on
the bed's real Kueue are in tests/doctor/test_doctor_kueue.py."""

from __future__ import annotations

import json

from auditor.doctor import (
    INFO,
    OK,
    WARN,
    attach_patch,
    gate_admission_check_checks,
    gate_queue_checks,
    queue_flavors,
)


def check(name: str, active: dict | None = None) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {"controllerName": "gpu-auditor.io/efficiency-gate"},
        "status": {"conditions": [{"type": "Active", **active}] if active else []},
    }


def queue(name: str, flavors: dict[str, str], rules: list[dict] | None = None, active: bool = True) -> dict:
    """``flavors``: flavor → the resource its group covers (one group per resource)."""
    groups: dict[str, list[str]] = {}
    for f, r in flavors.items():
        groups.setdefault(r, []).append(f)
    spec: dict = {
        "resourceGroups": [
            {"coveredResources": [r], "flavors": [{"name": f, "resources": [{"name": r}]} for f in fs]}
            for r, fs in groups.items()
        ]
    }
    if rules is not None:
        spec["admissionChecksStrategy"] = {"admissionChecks": rules}
    cond = {"type": "Active", "status": "True" if active else "False"}
    if not active:
        cond |= {"reason": "AdmissionCheckInactive", "message": "references inactive AdmissionCheck(s): gpu-efficiency"}
    return {"metadata": {"name": name}, "spec": spec, "status": {"conditions": [cond]}}


MIXED = {"h200": "nvidia.com/gpu", "cpu": "cpu"}


def test_the_admission_check_is_said_active_or_not_with_kueues_reason() -> None:
    (ok,) = gate_admission_check_checks(
        [check("gpu-efficiency", {"status": "True", "reason": "Active", "message": "gpu-auditor's gate is running"})],
        enabled=True,
    )
    assert ok.status == OK and ok.detail == "gpu-efficiency Active (True Active: gpu-auditor's gate is running)"
    (never,) = gate_admission_check_checks([check("gpu-efficiency")], enabled=True)
    assert never.status == WARN and "no Active condition" in never.detail and "admits nothing" in never.detail
    (off,) = gate_admission_check_checks(
        [check("gpu-efficiency", {"status": "False", "reason": "Stopped", "message": "no leader"})], enabled=True
    )
    assert off.detail.startswith("gpu-efficiency not Active (False Stopped: no leader)") and "logs" in off.fix
    (none,) = gate_admission_check_checks([], enabled=False)
    assert none.status == INFO and "(the gate is off here)" in none.detail
    assert gate_admission_check_checks([], enabled=True)[0].status == WARN


def test_a_check_scoped_to_the_gpu_flavors_is_ok() -> None:
    (ok,) = gate_queue_checks(
        ["gpu-efficiency"], [queue("gpu", MIXED, [{"name": "gpu-efficiency", "onFlavors": ["h200"]}])]
    )
    assert (ok.status, ok.detail) == (OK, "gpu runs gpu-efficiency onFlavors [h200], scoped to its GPU flavors")


def test_every_flavor_is_ok_on_a_gpu_only_queue_and_a_warning_on_a_mixed_one() -> None:
    (only,) = gate_queue_checks(
        ["gpu-efficiency"], [queue("g", {"h200": "nvidia.com/gpu"}, [{"name": "gpu-efficiency"}])]
    )
    assert only.status == OK and only.detail == "g runs gpu-efficiency on every flavor (h200), a GPU-only queue"
    (mixed,) = gate_queue_checks(["gpu-efficiency"], [queue("m", MIXED, [{"name": "gpu-efficiency"}])])
    assert mixed.status == WARN and "non-GPU flavor(s) cpu wait for the gate too" in mixed.detail
    assert '"onFlavors":["h200"]' in mixed.fix


def test_a_gpu_flavor_left_out_and_a_cpu_flavor_listed_are_warned() -> None:
    q = queue(
        "m",
        {"h200": "nvidia.com/gpu", "a100": "nvidia.com/gpu", "cpu": "cpu"},
        [{"name": "ge", "onFlavors": ["h200", "cpu"]}],
    )
    (warn,) = gate_queue_checks(["ge"], [q])
    assert warn.status == WARN and "GPU flavor(s) a100 not checked; cpu not a GPU flavor of this queue" in warn.detail


def test_unattached_check_and_gpu_queues_without_it_get_the_patch() -> None:
    other = {"name": "provisioning", "onFlavors": ["h200"]}
    queues = [queue("gpu", MIXED, [other]), queue("cpu-only", {"cpu": "cpu"})]
    (none,) = gate_queue_checks(["gpu-efficiency"], queues)
    assert none.status == WARN and "no ClusterQueue lists gpu-efficiency" in none.detail
    patch = attach_patch(queues[0], "gpu-efficiency")
    assert none.fix.endswith(patch) and "cpu-only" not in none.fix
    rules = json.loads(patch.split("-p ", 1)[1].strip("'"))["spec"]["admissionChecksStrategy"]["admissionChecks"]
    assert rules == [other, {"name": "gpu-efficiency", "onFlavors": ["h200"]}]  # the merge keeps what it ran
    attached = queue("a", MIXED, [{"name": "gpu-efficiency", "onFlavors": ["h200"]}])
    ok, bare = gate_queue_checks(["gpu-efficiency"], [attached, *queues])
    assert ok.status == OK and bare.detail == "ClusterQueue(s) with GPU quota without the gate: gpu"


def test_an_inactive_queue_is_a_warning_with_kueues_reason() -> None:
    (w,) = gate_queue_checks(
        ["gpu-efficiency"], [queue("g", MIXED, [{"name": "gpu-efficiency", "onFlavors": ["h200"]}], False)]
    )
    assert w.status == WARN and w.detail.endswith(
        "not Active (False AdmissionCheckInactive: references inactive AdmissionCheck(s): gpu-efficiency)"
    )


def test_gpu_flavors_are_those_covering_a_gpu_or_mig_resource() -> None:
    q = queue("q", {"h200": "nvidia.com/gpu", "mig": "nvidia.com/mig-1g.18gb", "cpu": "cpu"})
    assert queue_flavors(q) == (["h200", "mig", "cpu"], ["h200", "mig"])


def test_kueue_version_and_a_needed_gate_off_become_checklist_lines() -> None:
    from auditor.doctor import kueue_feature_checks
    from auditor.kube.kueue_features import ADMISSION_GATED_BY_GATE, feature_lines, install_from

    deployment = {
        "metadata": {"name": "kueue-controller-manager"},
        "spec": {
            "template": {"spec": {"containers": [{"name": "manager", "image": "registry.k8s.io/kueue/kueue:v0.17.0"}]}}
        },
    }
    install = install_from(deployment, None, "kueue-system")
    version, gated = kueue_feature_checks(feature_lines(install, (ADMISSION_GATED_BY_GATE,)))
    assert (version.name, version.status) == ("Kueue version", OK) and version.detail.startswith("v0.17.0 (image ")
    assert (gated.name, gated.status) == ("Kueue AdmissionGatedBy gate", WARN) and gated.detail.startswith("off (")
    assert "--feature-gates=AdmissionGatedBy=true" in gated.fix and "kueue-manager-config" in gated.fix
    (old,) = kueue_feature_checks(
        feature_lines(
            install_from({**deployment, "metadata": {"labels": {"app.kubernetes.io/version": "v0.15.1"}}}, None, "k"),
            (),
        )
    )
    assert old.status == WARN and "floor" in old.detail and old.fix.startswith("upgrade Kueue")
