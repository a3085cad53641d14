"""The operator's permissions data file: one source, no drift, nothing it must never grant.

The canonical file lives in the chart (Helm reads only files inside the chart directory);
auditor/permissions.yaml is the byte-identical copy the Python package ships.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CANONICAL = ROOT / "charts" / "gpu-auditor" / "files" / "permissions.yaml"
COPY = ROOT / "auditor" / "permissions.yaml"

SCOPES = {"cluster", "namespace"}
ENABLED_BY = {"always", "annotate", "events", "kueue", "requeue", "gate", "gateHolds"}
RULE_KEYS = {"apiGroups", "resources", "verbs", "resourceNamesFrom"}
NEVER_VERBS = {"*", "escalate", "bind", "impersonate", "deletecollection"}


def load() -> dict:
    return yaml.safe_load(CANONICAL.read_text())


def test_package_copy_is_identical():
    assert COPY.read_bytes() == CANONICAL.read_bytes(), (
        "auditor/permissions.yaml differs from the canonical chart file; run: "
        "cp charts/gpu-auditor/files/permissions.yaml auditor/permissions.yaml"
    )
    assert not COPY.is_symlink() and not CANONICAL.is_symlink()


def test_package_data_ships_the_copy():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"permissions.yaml"' in pyproject, "add permissions.yaml to [tool.setuptools.package-data] auditor"


def test_shape():
    perm = load()
    assert perm["kind"] == "Permissions"
    assert set(perm["features"]) >= {
        "discovery",
        "annotate",
        "events",
        "leaderElection",
        "settings",
        "kueueRead",
        "requeue",
    }
    for name, f in perm["features"].items():
        assert f["scope"] in SCOPES, name
        assert f["enabledBy"] in ENABLED_BY, name
        assert f["description"].strip(), name
        assert f["rules"], name
        for rule in f["rules"]:
            assert set(rule) <= RULE_KEYS, (name, rule)
            assert rule["apiGroups"] and rule["resources"] and rule["verbs"], (name, rule)
            assert rule.get("resourceNamesFrom") in (None, "leaseName", "secretNames", "holdsName"), (name, rule)


def test_never_granted():
    """No wildcards, no privilege escalation, no pod deletion, no Secrets outside its namespace."""
    for name, f in load()["features"].items():
        for rule in f["rules"]:
            verbs, resources = set(rule["verbs"]), set(rule["resources"])
            assert not verbs & NEVER_VERBS, (name, rule)
            assert "*" not in resources and "*" not in rule["apiGroups"], (name, rule)
            if "delete" in verbs:  # the gate re-admits a Workload it rejected by deleting it (Kueue #14870)
                assert (name, rule["apiGroups"], rule["resources"]) == ("gate", ["kueue.x-k8s.io"], ["workloads"]), rule
            if "secrets" in resources:
                assert f["scope"] == "namespace", f"{name}: Secrets only in the release namespace"
                assert rule.get("resourceNamesFrom") == "secretNames" and verbs == {"get"}, (name, rule)


def test_requeue_is_the_only_writer_of_workloads():
    """Patching Kueue Workloads (the requeue action) must come from the requeue feature alone; the
    gate only deletes the ones it rejected (and writes their status subresource's check state)."""
    for name, f in load()["features"].items():
        for rule in f["rules"]:
            if "kueue.x-k8s.io" in rule["apiGroups"] and "workloads" in rule["resources"]:
                writes = set(rule["verbs"]) - {"get", "list", "watch"}
                assert not writes or name == "requeue" or (name == "gate" and writes == {"delete"}), (name, rule)
    assert load()["features"]["requeue"]["enabledBy"] == "requeue"
