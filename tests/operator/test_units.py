"""Server-free parts of the operator: GPU requests, settings, owner kinds vs RBAC, windows."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from auditor.errors import BadInput
from auditor.kube.gpus import pod_gpus
from auditor.kube.resolver import KINDS
from auditor.operator_loop.cycle import CycleRunner, align_down
from auditor.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


def _c(limits=None, requests=None, **extra):
    res = {}
    if limits:
        res["limits"] = limits
    if requests:
        res["requests"] = requests
    return {"name": "c", "resources": res, **extra}


@pytest.mark.parametrize(
    "spec, gpus",
    [
        ({"containers": [_c()]}, 0),
        ({"containers": [_c({"cpu": "2"})]}, 0),
        ({"containers": [_c({"nvidia.com/gpu": "4"})]}, 4),
        ({"containers": [_c(requests={"nvidia.com/gpu": 2})]}, 2),
        ({"containers": [_c({"nvidia.com/gpu": "1"}), _c({"nvidia.com/gpu": "2"})]}, 3),
        ({"containers": [_c({"nvidia.com/mig-3g.40gb": "1"})]}, 3 / 7),
        ({"containers": [_c({"nvidia.com/mig-1g.10gb": "2"})]}, 2 / 7),
        ({"containers": [_c({"nvidia.com/mig-1c.3g.40gb": "1"})]}, 1 / 7),
        # a plain init container runs before the app: the pod needs the larger of the two
        ({"initContainers": [_c({"nvidia.com/gpu": "1"})], "containers": [_c({"nvidia.com/gpu": "2"})]}, 2),
        ({"initContainers": [_c({"nvidia.com/gpu": "4"})], "containers": [_c({"nvidia.com/gpu": "2"})]}, 4),
        # a sidecar (restartPolicy Always) runs beside the app: it adds
        (
            {
                "initContainers": [_c({"nvidia.com/gpu": "1"}, restartPolicy="Always")],
                "containers": [_c({"nvidia.com/gpu": "2"})],
            },
            3,
        ),
        ({"containers": [_c({"nvidia.com/gpu": "garbage"})]}, 0),
    ],
)
def test_pod_gpus(spec, gpus):
    assert pod_gpus(spec) == pytest.approx(gpus)


def test_owner_kinds_match_the_permissions_file():
    perms = yaml.safe_load((ROOT / "auditor" / "permissions.yaml").read_text())["features"]["discovery"]["rules"]
    granted = {(g, r) for rule in perms for g in rule["apiGroups"] for r in rule["resources"] if "get" in rule["verbs"]}
    for (group, _kind), plural in KINDS.items():
        assert (group, plural) in granted, f"{group}/{plural} is fetched but not granted"


def test_chart_settings_file_loads(tmp_path):
    """The keys docs/install.md gives for the chart's settings file are all accepted."""
    text = (ROOT / "docs" / "install.md").read_text()
    block = text.split("### The settings file", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    f = tmp_path / "s.yaml"
    f.write_text(block)
    s = load_settings(f, environ={})
    assert s.cluster == "prod-east" and s.interval == timedelta(minutes=5)
    assert s.leader_election.lease_duration == timedelta(seconds=15)
    assert s.team_sources[-1] == "namespace"


def test_unknown_key_is_named(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("leader_election:\n  lease_durration: 10s\nintervall: 5m\n")
    with pytest.raises(BadInput) as e:
        load_settings(f, environ={})
    assert "leader_election.lease_durration" in str(e.value) and "intervall" in str(e.value) and str(f) in str(e.value)


def test_bad_values_are_named(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("interval: soon\nteam_sources: [podLabel:team, bogus]\n")
    with pytest.raises(BadInput) as e:
        load_settings(f, environ={})
    assert "interval" in str(e.value) and "bogus" in str(e.value)


def test_environment_overrides_file_and_flags_override_environment(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("interval: 5m\ncluster: a\nstore: {url_env: MY_DB}\n")
    env = {
        "GPU_AUDITOR_INTERVAL": "1m",
        "GPU_AUDITOR_LEADER_ELECTION__LEASE_DURATION": "30s",
        "GPU_AUDITOR_PROMETHEUS_URL": "http://p:9090",
        "MY_DB": "postgresql://u:hunter2@db/x",
        "GPU_AUDITOR_PROMETHEUS_TOKEN": "not-a-setting",
    }
    s = load_settings(f, environ=env, overrides={"cluster": "b"})
    assert (s.interval, s.leader_election.lease_duration, s.prometheus.url, s.cluster) == (
        timedelta(minutes=1),
        timedelta(seconds=30),
        "http://p:9090",
        "b",
    )
    assert s.database_url(env) == "postgresql://u:hunter2@db/x"
    with pytest.raises(BadInput, match="GPU_AUDITOR_LEADER_ELECTION__LEASE_DURATIO"):
        load_settings(None, environ={"GPU_AUDITOR_LEADER_ELECTION__LEASE_DURATIO": "3s"})


def test_secrets_are_masked():
    s = load_settings(None, environ={"GPU_AUDITOR_STORE__URL": "postgresql://u:hunter2@db/x"})
    assert "hunter2" not in repr(s.masked()) and "***" in s.masked()["store"]["url"]


def test_lease_timings_must_be_ordered():
    with pytest.raises(BadInput, match="retry_period < renew_deadline < lease_duration"):
        load_settings(None, environ={"GPU_AUDITOR_LEADER_ELECTION__RENEW_DEADLINE": "20s"})


class _NoRuns:
    def runs(self, limit=100):
        return []


def test_catch_up_is_chunked_and_aligned():
    r = CycleRunner(
        store=_NoRuns(),
        source=None,
        resolver=None,
        cluster="c",
        width=timedelta(minutes=5),
        catch_up_chunk=timedelta(hours=1),
    )
    now = datetime(2026, 11, 30, 12, 7, 30, tzinfo=timezone.utc)
    w = r.plan(now, {})
    assert w.start == align_down(now - timedelta(minutes=5), timedelta(minutes=5)) and w.end == now
    from auditor.core.model import Window

    chunks = r.chunks(Window(datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc), now))
    assert [c.start.hour for c in chunks] == [9, 10, 11, 12] and chunks[-1].end == now
