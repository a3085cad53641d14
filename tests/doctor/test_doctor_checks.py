"""doctor's checks one by one on a fixed Telemetry, no Prometheus: each is a small function of
what one read saw (the full checklist against real Prometheus is tests/doctor/test_doctor.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from auditor.core.metrics import Metric, Naming
from auditor.core.readings import SourceReport
from auditor.doctor import CHECKS, FAIL, OK, WARN, Telemetry, check_pod_attribution, check_sm_activity, run_checks

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)


def telemetry(present: set[Metric], **stats: object) -> Telemetry:
    s = {
        "names": ["DCGM_FI_DEV_GPU_UTIL"],
        "naming": Naming.CLASSIC,
        "naming_why": "",
        "mig": False,
        "hosts": {"n1": set(present), "n2": set(present)},
        "gpus": {"g1", "g2"},
        "attributed": {"g1"},
        "exporter_pods": set(),
    } | stats
    return Telemetry(SimpleNamespace(), NOW, timedelta(hours=1), SourceReport(present=present), SimpleNamespace(**s))


def test_sm_activity_is_required_and_names_the_nodes_without_it() -> None:
    (absent,) = check_sm_activity(telemetry({Metric.GPU_UTIL}))
    assert (absent.status, absent.required) == (FAIL, True) and "DCGM_FI_PROF_SM_ACTIVE" in absent.fix
    partial = telemetry({Metric.GPU_UTIL, Metric.SM_ACTIVE}, hosts={"n1": {Metric.SM_ACTIVE}, "n2": set()})
    (warn,) = check_sm_activity(partial)
    assert warn.status == WARN and "not on 1 node(s): n2" in warn.detail


def test_pod_attribution_counts_the_gpus_with_a_pod_label() -> None:
    (ok,) = check_pod_attribution(telemetry({Metric.GPU_UTIL}))
    assert ok.status == OK and ok.detail.startswith("1 of 2 GPUs (50%) attributed to pods")
    checks = check_pod_attribution(telemetry({Metric.GPU_UTIL}, attributed=set(), exporter_pods={"dcgm-exporter-x"}))
    assert [c.status for c in checks] == [WARN, WARN]


def test_an_unreachable_prometheus_stops_the_checklist_at_its_first_line() -> None:
    from auditor.errors import SourceUnavailable

    class Down:
        def buildinfo(self) -> dict:
            raise SourceUnavailable("connection refused")

    (only,) = run_checks(SimpleNamespace(client=Down()), NOW)
    assert (only.name, only.status, only.failed) == ("Prometheus reachable", FAIL, True)
    assert len(CHECKS) == len(set(CHECKS))
