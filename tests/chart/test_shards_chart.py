"""operator.shards: a StatefulSet of one pod per shard, each with its own Lease (and the RBAC to
take exactly those), accepted by the bed's real apiserver; SQLite refused (docs/scale.md)."""

from __future__ import annotations

import pytest
import yaml
from chartlib import Chart, find

pytestmark = pytest.mark.testbed

SHARDED = ["store.type=postgresql", "store.postgresql.urlSecret.name=pg", "operator.shards=4"]


def test_four_shards_render_a_statefulset_with_a_lease_each(chart: Chart, namespace: str) -> None:
    text = chart.template_text(namespace=namespace, release="ga", sets=SHARDED).out
    objs = [d for d in yaml.safe_load_all(text) if d]
    assert not find(objs, "Deployment", "ga-gpu-auditor")
    (sts,) = find(objs, "StatefulSet", "ga-gpu-auditor")
    assert sts["spec"]["replicas"] == 4 and sts["spec"]["podManagementPolicy"] == "Parallel"
    (container,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"] or [
        sts["spec"]["template"]["spec"]["containers"][0]
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPU_AUDITOR_SHARDING__TOTAL_SHARDS"] == "4" and "POD_NAME" in env  # the ordinal names the shard
    leases = [
        r for role in find(objs, "Role") for r in role["rules"] if "leases" in r["resources"] and "resourceNames" in r
    ]
    assert [r["resourceNames"] for r in leases] == [[f"ga-gpu-auditor-shard-{i}" for i in range(4)]]
    res = chart.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=text)
    accepted = [line for line in res.out.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(objs), res.out + res.err


def test_one_shard_stays_a_deployment_and_sqlite_refuses_shards(chart: Chart) -> None:
    (dep,) = find(chart.render(), "Deployment", "ga-gpu-auditor") or find(chart.render(), "Deployment")
    assert "GPU_AUDITOR_SHARDING__TOTAL_SHARDS" not in str(dep)
    res = chart.template_text(sets=["operator.shards=2"], check=False)
    assert res.rc != 0 and "operator.shards=2 needs store.type=postgresql" in res.err
