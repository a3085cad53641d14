"""One hostile metric series must never take an audit or a cycle down.

The probe (issue 35, "High"): two pods of dcgm-exporter history, one relabelled
``pod="job-1/../x"`` (labels come from exporters and from whatever workloads can push). ``audit
--no-kube`` exited 1 with a traceback from ``split_job`` and the healthy pod was not reported;
``run --once`` stored nothing for any job. Now the name is checked where labels become a pod
(auditor/sources/promql.py ``pod_of``, the rules in auditor/core/identity.py): the series is
quarantined (said once, counted per reason) and every other job is audited and stored as before.

The fast probes here answer from :class:`~tests.sources.synthetic_prometheus.SyntheticPrometheus`;
the bed probes (real Prometheus, real kube-apiserver) are at the end of the file.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Iterator

import pytest

from auditor.cli.main import main
from tests.sources.synthetic_prometheus import Series, SyntheticPrometheus

#: a 30-minute window of 5-minute buckets, long past (the audit's own "now" is not asserted)
START, END = 1_767_225_600, 1_767_225_600 + 1800
RANGE = ["--start", "2026-01-01T00:00:00Z", "--end", "2026-01-01T00:30:00Z"]


def gpu(n: int, **extra: str) -> dict[str, str]:
    return {
        "gpu": str(n % 8),
        "UUID": f"GPU-hostile-{n}",
        "Hostname": f"node-{n // 8}",
        "modelName": "NVIDIA H200",
        "namespace": "ml",
        "container": "main",
        **extra,
    }


def history(pods: dict[int, str], step: int = 15) -> list[Series]:
    """Busy GPUs (util 80 %, SM active 0.6) held by ``pods`` (GPU number → pod label)."""
    out: list[Series] = []
    for n, pod in pods.items():
        labels = gpu(n, pod=pod)
        out.append(Series("DCGM_FI_DEV_GPU_UTIL", labels, [(t, 80.0) for t in range(START, END, step)]))
        out.append(Series("DCGM_FI_PROF_SM_ACTIVE", labels, [(t, 0.6) for t in range(START, END, step)]))
    return out


@pytest.fixture
def synthetic() -> Iterator[SyntheticPrometheus]:
    prom = SyntheticPrometheus()
    yield prom
    prom.close()


def audit(capsys: pytest.CaptureFixture[str], url: str, db: Path, *extra: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["audit", "--prometheus", url, "--no-kube", *RANGE, "--db", f"sqlite:///{db}", "-o", "json", *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def stored_jobs(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select j.kind, j.name from jobs j join job_summaries s on s.job_id = j.id").fetchall()
    return sorted(f"{k}/{n}" for k, n in rows)


def test_a_slash_in_a_pod_label_is_quarantined_and_the_audit_goes_on(
    synthetic: SyntheticPrometheus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    synthetic.series = history({0: "job-0", 1: "job-1/../x"})
    rc, out, err = audit(capsys, synthetic.url, tmp_path / "a.db")
    assert rc == 0, err
    assert "Traceback" not in err
    assert '"job": "Pod/job-0"' in out and "job-1/../x" not in out
    assert stored_jobs(tmp_path / "a.db") == ["Pod/job-0"]
    said = [line for line in err.splitlines() if "rejected" in line]
    assert said == ["warning: 1 series rejected (invalid_pod): pod 'job-1/../x' (not a Kubernetes name)"], err


@pytest.mark.parametrize(
    ("labels", "reason"),
    [
        ({"pod": "job-1/../x"}, "invalid_pod"),
        ({"pod": ".."}, "invalid_pod"),
        ({"pod": "Job-1"}, "invalid_pod"),  # upper case: no pod can be named so
        ({"pod": "x" * 254}, "invalid_pod"),  # a subdomain is 253 at most
        ({"pod": "job\x1b[31m"}, "invalid_pod"),
        ({"pod": "job\n1"}, "invalid_pod"),
        ({"pod": "ok", "namespace": "team/a"}, "invalid_namespace"),
        ({"pod": "ok", "namespace": "a.b"}, "invalid_namespace"),  # a label, not a subdomain
        ({"pod": "ok", "namespace": "n" * 64}, "invalid_namespace"),
        ({"pod": "ok", "container": "main/../x"}, "invalid_container"),
    ],
)
def test_each_kind_of_hostile_name_is_refused_with_its_reason(
    labels: dict[str, str], reason: str, synthetic: SyntheticPrometheus, tmp_path: Path, capsys
) -> None:
    clean = history({0: "job-0"})
    hostile = gpu(1, **labels)
    synthetic.series = clean + [Series("DCGM_FI_DEV_GPU_UTIL", hostile, [(t, 50.0) for t in range(START, END, 15)])]
    rc, out, err = audit(capsys, synthetic.url, tmp_path / "a.db")
    assert rc == 0, err
    assert stored_jobs(tmp_path / "a.db") == ["Pod/job-0"]
    said = [line for line in err.splitlines() if "rejected" in line]
    assert len(said) == 1 and said[0].startswith(f"warning: 1 series rejected ({reason}): "), err
    assert "\x1b" not in err  # the name is quoted, never written raw to a terminal


def test_names_kubernetes_allows_are_audited_as_before(synthetic: SyntheticPrometheus, tmp_path: Path, capsys) -> None:
    longest = "a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "." + "d" * 61  # 253 characters
    synthetic.series = history({0: "job-0", 1: "web.v2-1", 2: longest, 3: "0"})
    rc, out, err = audit(capsys, synthetic.url, tmp_path / "a.db")
    assert rc == 0, err
    assert stored_jobs(tmp_path / "a.db") == sorted(["Pod/job-0", "Pod/web.v2-1", f"Pod/{longest}", "Pod/0"])
    assert "rejected" not in err


def test_doctor_names_the_refused_series_once_per_reason(synthetic: SyntheticPrometheus) -> None:
    from datetime import datetime, timedelta, timezone

    from auditor.doctor import WARN, run_checks
    from auditor.sources.prometheus import PrometheusSource

    synthetic.series = history({0: "job-0", 1: "job-1/../x", 2: "Job-2"})
    source = PrometheusSource(synthetic.url)
    try:
        checks = run_checks(source, datetime.fromtimestamp(END, timezone.utc), timedelta(minutes=30))
    finally:
        source.close()
    hostile = [c for c in checks if c.name == "hostile identities"]
    assert [(c.status, c.detail) for c in hostile] == [
        (WARN, "2 series rejected (invalid_pod): pod 'job-1/../x', pod 'Job-2' (not a Kubernetes name)")
    ]
    assert "not audited" in hostile[0].fix
