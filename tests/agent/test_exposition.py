"""What the agent serves: dcgm-exporter names, units and labels; means over the scrape interval; absent, never 0."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.agent.fields import FIELDS, PROFILING
from auditor.agent.recorded import RecordedSampler, trace_rows
from auditor.agent.sampler import Device
from auditor.agent.server import Agent, parse_listen, parse_seconds
from auditor.agent.window import SampleWindow, Tick
from auditor.core.metrics import BY_NAME as AUDIT_NAMES
from auditor.core.model import PodRef
from auditor.errors import BadInput
from auditor.traces import load_trace

GPU0 = Device(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA H200", "00000000:19:00.0")
GPU1 = Device(1, "GPU-bbbbbbbb-0000-0000-0000-000000000000", "NVIDIA H200", "00000000:3B:00.0")
MIG = Device(
    2,
    "GPU-cccccccc-0000-0000-0000-000000000000",
    "NVIDIA H200",
    "00000000:4C:00.0",
    gi_id="3",
    gi_profile="1g.18gb",
    mig_uuid="MIG-11111111-2222-3333-4444-555555555555",
)
POD = PodRef("ml", "train-0", "main")


def _series(text: str) -> list[tuple[str, dict, float]]:
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


class _Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _agent(rows: dict, devices=(GPU0, GPU1), owners=None, **kw) -> tuple[Agent, _Clock]:
    clock = _Clock()
    lister = (lambda: owners) if owners is not None else None
    agent = Agent(RecordedSampler(list(devices), rows), node_name="gpu-node-1", pod_resources=lister, clock=clock, **kw)
    return agent, clock


def test_every_exported_name_is_one_the_audit_reads_or_a_known_dcgm_field():
    audit_read = {n for n in AUDIT_NAMES}
    for f in FIELDS:
        assert f.name.startswith("DCGM_FI_")
    assert {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
    } <= audit_read & {f.name for f in FIELDS}


def test_labels_units_and_mean_over_the_scrape_interval():
    rows = {
        GPU0.key: [
            {"DCGM_FI_DEV_GPU_UTIL": 100.0, "DCGM_FI_PROF_SM_ACTIVE": 0.01},
            {"DCGM_FI_DEV_GPU_UTIL": 100.0, "DCGM_FI_PROF_SM_ACTIVE": 0.03},
        ],
        GPU1.key: [{"DCGM_FI_DEV_GPU_UTIL": 0.0, "DCGM_FI_PROF_SM_ACTIVE": 0.0}],
    }
    from auditor.agent.podresources import Allocation

    agent, clock = _agent(rows, owners=[Allocation("ml", "train-0", "main", "nvidia.com/gpu", (GPU0.uuid,))])
    agent.refresh_owners()
    for _ in range(4):  # 4 ticks, one second apart
        clock.t += 1
        agent.tick()
    body, ctype = agent.render("prom-a")
    assert ctype.startswith("text/plain")
    series = _series(body.decode())
    sm = {s[1]["UUID"]: s for s in series if s[0] == "DCGM_FI_PROF_SM_ACTIVE"}
    # mean of 0.01, 0.03, 0.01, 0.03: not the last point
    assert sm[GPU0.uuid][2] == pytest.approx(0.02)
    assert sm[GPU0.uuid][1] == {
        "gpu": "0",
        "UUID": GPU0.uuid,
        "pci_bus_id": GPU0.pci_bus_id,
        "device": "nvidia0",
        "modelName": "NVIDIA H200",
        "Hostname": "gpu-node-1",
        "container": "main",
        "namespace": "ml",
        "pod": "train-0",
        "source": "gpu-auditor-agent",
    }
    # a GPU no pod holds: no pod labels at all (not pod="")
    assert not {"pod", "namespace", "container"} & set(sm[GPU1.uuid][1])
    util = {s[1]["UUID"]: s[2] for s in series if s[0] == "DCGM_FI_DEV_GPU_UTIL"}
    assert util == {GPU0.uuid: 100.0, GPU1.uuid: 0.0}  # a percent, as dcgm-exporter
    info = [s for s in series if s[0] == "gpu_auditor_agent_info"]
    assert info and info[0][1]["backend"] == "recorded"
    assert [s[2] for s in series if s[0] == "gpu_auditor_agent_window_samples"] == [4.0]

    # the next scrape by the same scraper averages only the newer samples
    clock.t += 1
    agent.tick()  # row index 4 → 0.01
    series = _series(agent.render("prom-a")[0].decode())
    assert [s[2] for s in series if s[0] == "DCGM_FI_PROF_SM_ACTIVE" and s[1]["UUID"] == GPU0.uuid] == [
        pytest.approx(0.01)
    ]
    # another scraper (a second Prometheus replica) gets its own complete window
    series = _series(agent.render("prom-b")[0].decode())
    assert [s[2] for s in series if s[0] == "DCGM_FI_PROF_SM_ACTIVE" and s[1]["UUID"] == GPU0.uuid] == [
        pytest.approx(0.018)
    ]


def test_profiling_series_are_absent_without_profiling_never_zero():
    rows = {GPU0.key: [{"DCGM_FI_DEV_GPU_UTIL": 87.0, "DCGM_FI_DEV_POWER_USAGE": 300.0}]}
    agent, clock = _agent(rows)
    clock.t += 1
    agent.tick()
    names = {s[0] for s in _series(agent.render("p")[0].decode())}
    assert "DCGM_FI_DEV_GPU_UTIL" in names and "DCGM_FI_DEV_POWER_USAGE" in names
    assert not names & PROFILING
    assert not any(
        s[0].startswith("DCGM_") and s[1]["UUID"] == GPU1.uuid for s in _series(agent.render("q")[0].decode())
    )


def test_mig_instances_carry_gpu_instance_labels_and_parent_identity():
    from auditor.agent.podresources import Allocation

    rows = {MIG.key: [{"DCGM_FI_PROF_SM_ACTIVE": 0.5, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.6}]}
    agent, clock = _agent(
        rows, devices=(MIG,), owners=[Allocation("ml", "small", "c", "nvidia.com/mig-1g.18gb", (MIG.mig_uuid,))]
    )
    agent.refresh_owners()
    clock.t += 1
    agent.tick()
    sm = [s for s in _series(agent.render("p")[0].decode()) if s[0] == "DCGM_FI_PROF_SM_ACTIVE"]
    assert len(sm) == 1
    labels = sm[0][1]
    assert (
        labels["UUID"] == MIG.uuid
        and labels["gpu"] == "2"
        and labels["GPU_I_ID"] == "3"
        and labels["GPU_I_PROFILE"] == "1g.18gb"
    )
    assert labels["pod"] == "small"


def test_owner_change_inside_a_window_splits_the_means():
    w = SampleWindow(first_window=100)
    a, b = PodRef("ns", "a"), PodRef("ns", "b")
    for i, owner in enumerate([a, a, b, b, b]):
        w.add(Tick(10.0 + i, {"G": (owner, {"X": float(i)})}))
    means, n = w.take("s", 20.0)
    assert n == 5
    assert means[("G", a)]["X"].value == pytest.approx(0.5)
    assert means[("G", b)]["X"].value == pytest.approx(3.0)


def test_scraping_faster_than_sampling_repeats_the_latest_sample():
    w = SampleWindow(first_window=10)
    w.add(Tick(1.0, {"G": (None, {"X": 7.0})}))
    assert w.take("s", 1.5)[0][("G", None)]["X"].value == 7.0
    means, n = w.take("s", 1.7)
    assert n == 1 and means[("G", None)]["X"].value == 7.0


def test_old_samples_are_forgotten():
    w = SampleWindow(keep=60, first_window=1000)
    for t in range(0, 200):
        w.add(Tick(float(t), {"G": (None, {"X": 1.0})}))
    assert w.take("s", 200.0)[1] == 61


def test_replayed_trace_rows_are_in_exporter_units():
    trace = load_trace("h200-microbench")
    rows = trace_rows(trace, "one_sm_spin")
    assert rows and all(r["DCGM_FI_DEV_GPU_UTIL"] >= 95 for r in rows)  # percent
    assert all(r["DCGM_FI_PROF_SM_ACTIVE"] < 0.02 for r in rows)  # ratio


def test_http_server_serves_metrics_and_health():
    rows = {GPU0.key: [{"DCGM_FI_DEV_GPU_UTIL": 50.0}]}
    agent, clock = _agent(rows, interval=0.05)
    agent.clock = __import__("time").time
    try:
        host, port = agent.serve("127.0.0.1", 0)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=5)
        assert err.value.code == 503  # no sample yet
        agent.start()
        import time

        deadline = time.time() + 5
        while agent.samples < 3 and time.time() < deadline:
            time.sleep(0.05)
        assert urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=5).status == 200
        req = urllib.request.Request(
            f"http://{host}:{port}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        resp = urllib.request.urlopen(req, timeout=5)
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert b"DCGM_FI_DEV_GPU_UTIL{" in resp.read()
        text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
        assert 'source="gpu-auditor-agent"' in text
    finally:
        agent.stop()


@pytest.mark.parametrize(
    "value,expected", [("0.0.0.0:9400", ("0.0.0.0", 9400)), (":9400", ("0.0.0.0", 9400)), ("[::1]:80", ("::1", 80))]
)
def test_parse_listen(value, expected):
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["9400", "host:", "host:99999"])
def test_parse_listen_rejects(value):
    with pytest.raises(BadInput):
        parse_listen(value)


def test_parse_seconds():
    assert parse_seconds("1s", "--interval") == 1.0
    assert parse_seconds("250ms", "--interval") == 0.25
    assert parse_seconds("2", "--interval") == 2.0
    for bad in ("0s", "-1", "fast"):
        with pytest.raises(BadInput):
            parse_seconds(bad, "--interval")


def test_stopped_sampling_makes_gpu_series_disappear_not_repeat():
    w = SampleWindow(first_window=10)
    w.add(Tick(1.0, {"G": (None, {"X": 7.0})}))
    assert w.take("s", 2.0)[1] == 1
    assert w.take("s", 60.0) == ({}, 0)  # the last sample is stale: nothing, not 7.0 again
