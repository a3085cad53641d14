"""dcgm-exporter 4.10's names (issue 29): the PCIe rates renamed ``DCGM_FI_PROF_PCIE_{RX,TX}_BYTES_PER_SECOND``.

The renaming comes from issue 29's text, not yet from an upstream file (the newest stored
dcgm-exporter, go-dcgm and DCGM snapshots predate 4.10: tests/fixtures/dcgm/README.md). As for
classic, DCGM 4.6 and dcgm-exporter 4.9: the names are the fixture's, the naming is detected from
the name set alone, the units normalize to the project's, and the copy-only diagnosis keeps its
PCIe evidence when a real Prometheus holds only the 4.10 names.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from dcgm_upstream import load
from test_audit_traces import _audit, _build, _close, _pod

from auditor import traces
from auditor.core.metrics import (
    BY_NAME,
    EXPORTER410_ONLY,
    SPECS,
    Metric,
    Naming,
    detect_naming,
    name_for,
    normalize,
    scale_of,
)
from auditor.core.model import PodRef

UP = load()
PCIE = (Metric.PCIE_RX, Metric.PCIE_TX)


def test_the_renamed_pcie_rates_are_read_under_4_10_only():
    for old, (new, unit) in UP.renames_410.items():
        metric = BY_NAME[old]
        assert BY_NAME[new] is metric and metric in PCIE
        assert name_for(metric, Naming.EXPORTER410) == new
        assert name_for(metric, Naming.EXPORTER49) == old  # 4.9 and earlier keep the old name
        assert unit == SPECS[metric].unit == "B/s"
        assert scale_of(new, Naming.EXPORTER410) == scale_of(old, Naming.EXPORTER49) == 1.0
    assert EXPORTER410_ONLY == {new for new, _ in UP.renames_410.values()}


def test_every_name_read_under_4_10_is_one_the_fixture_gives():
    read = {n for n in BY_NAME if any(n == name_for(m, Naming.EXPORTER410) for m in Metric)}
    assert read <= UP.names("exporter-4.10"), read - UP.names("exporter-4.10")


@pytest.mark.parametrize("util", [[0.8, 0.35], [80.0], [0.0, 1.0], []])
def test_4_10_is_detected_from_its_names_whatever_the_values(util):
    guess = detect_naming(UP.names("exporter-4.10") & set(BY_NAME), util)
    assert guess.naming is Naming.EXPORTER410
    assert "BYTES_PER_SECOND" in guess.why and not guess.util_unknown


def test_older_name_sets_are_not_taken_for_4_10():
    for generation, expected in (
        ("classic", Naming.CLASSIC),
        ("dcgm-4.6", Naming.DCGM46),
        ("exporter-4.9", Naming.EXPORTER49),
    ):
        assert detect_naming(UP.names(generation) & set(BY_NAME), [37.0]).naming is expected


def test_4_10_normalizes_to_the_project_units():
    # one physical state in 4.10's exporter units: as 4.9 (ratio, hertz) plus the PCIe rates in B/s
    state = {
        Metric.GPU_UTIL: (0.8, 0.8),
        Metric.SM_CLOCK: (1.98e9, 1980.0),
        Metric.MAX_SM_CLOCK: (1.98e9, 1980.0),
        Metric.POWER: (350.5, 350.5),
        Metric.SM_ACTIVE: (0.4, 0.4),
        Metric.PCIE_RX: (2.5e10, 2.5e10),
        Metric.PCIE_TX: (1.2e9, 1.2e9),
    }
    names = UP.names("exporter-4.10")
    for metric, (raw, project) in state.items():
        (name,) = [n for n in names if BY_NAME.get(n) is metric]
        assert normalize(metric, raw, scale_of(name, Naming.EXPORTER410)) == pytest.approx(project), name


def test_openmetrics_under_4_10_spells_the_new_pcie_names():
    trace = traces.load_trace("h200-workloads")
    job = traces.TraceJob(PodRef("t", "h2d", "main"), traces.make_gpus(1, "n"), "h2d_copy_pinned")
    text = traces.trace_to_openmetrics(
        trace,
        [job],
        end=datetime(2026, 12, 1, tzinfo=timezone.utc),
        duration=timedelta(minutes=5),
        interval=timedelta(seconds=15),
        naming=Naming.EXPORTER410,
    )
    assert "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND{" in text and "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND{" in text
    assert "DCGM_FI_PROF_PCIE_RX_BYTES{" not in text and "DCGM_FI_DEV_SM_CLOCK_HERTZ{" in text


@pytest.mark.testbed
def test_copy_only_keeps_its_pcie_evidence_on_4_10_names(prometheus, tmp_path, capsys):
    """Issue 15's recorded workloads as dcgm-exporter 4.10 names them, through the bed's real
    Prometheus and ``audit --no-kube``: the host-to-device copy is still diagnosed copy_only with
    its PCIe rates, and the run says which naming it read."""
    work = traces.load_trace("h200-workloads")
    end = datetime.fromtimestamp(int(datetime.now(timezone.utc).timestamp()) // 300 * 300 - 2 * 3600, timezone.utc)
    text, ds = _build(work, end, convention="pod", hostname="hostname", namespace="work410", naming=Naming.EXPORTER410)
    assert "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND{" in text and "DCGM_FI_PROF_PCIE_RX_BYTES{" not in text
    prometheus.backfill(text)
    summaries = _audit(prometheus, ds, f"sqlite:///{tmp_path}/a.db", capsys)
    copy = {s["job"]: s for s in summaries}[f"Pod/{_pod('h2d_copy_pinned')}"]
    assert "copy_only" in [f["code"] for f in copy["findings"]]
    means = work.steady_means("h2d_copy_pinned")
    assert _close(copy["pcie_rx_bytes_per_s"], means[Metric.PCIE_RX])
    assert _close(copy["pcie_tx_bytes_per_s"], means[Metric.PCIE_TX])
