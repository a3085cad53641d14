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

#: each probe runs a whole audit over HTTP (about a second): slow-marked, still in `make test`
pytestmark = pytest.mark.slow

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


# -- on the bed: real Prometheus, real kube-apiserver, the operator's own cycle ---------------------


def _bed_history(case: str, ns: str, pods: list[str], end: int, minutes: int = 10) -> str:
    """OpenMetrics for busy GPUs held by ``pods`` (one GPU each) over the ``minutes`` before ``end``."""
    from tests.sources.test_prometheus_source import _om

    series = []
    for n, pod in enumerate(pods):
        labels = {"case": case, "UUID": f"GPU-{case}-{n}", "Hostname": f"node-{n // 8}", "gpu": str(n % 8)}
        labels |= {"namespace": ns, "pod": pod, "container": "main"}
        samples = [(float(t), 80.0) for t in range(end - 60 * minutes, end, 15)]
        series.append(("DCGM_FI_DEV_GPU_UTIL", labels, samples))
    return _om(series)


def _cycle(testbed, prometheus, store_url: str, case: str, now):  # -> CycleResult
    from auditor.kube.client import KubeConfig, api_client
    from auditor.kube.resolver import KubeResolver
    from auditor.operator_loop.cycle import CycleRunner
    from auditor.sources.prometheus import PrometheusSource
    from auditor.store import Store

    resolver = KubeResolver(api_client(KubeConfig(kubeconfig=testbed.kubeconfig)), cluster=case).start()
    try:
        assert resolver.wait_synced(60.0)
        with Store.open(store_url) as store:
            source = PrometheusSource(prometheus.url, matchers={"case": case})
            try:
                runner = CycleRunner(store=store, source=source, resolver=resolver, cluster=case)
                return runner.run(now)
            finally:
                source.close()
    finally:
        resolver.stop()


def _stored(store_url: str, case: str) -> list[str]:
    from auditor.store import Store

    with Store.open(store_url) as store:
        return sorted(ref.job for _id, ref, _first, _last in store.open_jobs(case))


def test_on_the_bed_one_hostile_series_among_1000_clean_ones(testbed, prometheus, tmp_path: Path) -> None:
    """The done-when probe: a cycle with one hostile series among 1,000 clean ones stores the
    1,000 and counts the one (gpu_auditor_series_rejected_total{reason="invalid_pod"} 1)."""
    import time
    import uuid
    from datetime import datetime, timezone

    from prometheus_client import generate_latest

    from auditor.operator_loop.health import OperatorMetrics

    case = f"hl{uuid.uuid4().hex[:8]}"
    end = int(time.time()) // 300 * 300 - 2 * 3600  # backfill wants the past
    clean = [f"job-{i}" for i in range(1000)]
    prometheus.backfill(_bed_history(case, "ml", [*clean, "job-1/../x"], end))
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    result = _cycle(testbed, prometheus, store_url, case, datetime.fromtimestamp(end, timezone.utc))
    assert len(result.summaries) == 1000
    assert _stored(store_url, case) == sorted(f"Pod/{p}" for p in clean)
    assert result.rejected.counts == {"invalid_pod": 1}
    assert result.warnings.count("1 series rejected (invalid_pod): pod 'job-1/../x' (not a Kubernetes name)") == 1
    metrics = OperatorMetrics()
    metrics.count_rejected(result.rejected)
    text = generate_latest(metrics.registry).decode()
    assert 'gpu_auditor_series_rejected_total{reason="invalid_pod"} 1.0' in text
    assert 'gpu_auditor_series_rejected_total{reason="invalid_namespace"} 0.0' in text


def test_on_the_bed_the_issues_audit_no_longer_fails(prometheus, tmp_path: Path, capsys) -> None:
    """The issue's reproduction as it was run: two pods, one relabelled pod="job-1/../x",
    ``audit --no-kube`` against the real Prometheus: exit 0, the healthy pod reported and stored."""
    import time
    import uuid
    from datetime import datetime, timezone

    case = f"hl{uuid.uuid4().hex[:8]}"
    end = int(time.time()) // 300 * 300 - 2 * 3600
    prometheus.backfill(_bed_history(case, "ml", ["job-0", "job-1/../x"], end, minutes=30))
    fmt = lambda t: datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    capsys.readouterr()
    db = tmp_path / "a.db"
    rc = main(
        ["audit", "--prometheus", prometheus.url, "--match", f"case={case}", "--no-kube", "-o", "json"]
        + ["--start", fmt(end - 1800), "--end", fmt(end), "--db", f"sqlite:///{db}"]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert '"job": "Pod/job-0"' in out.out and "Traceback" not in out.err
    assert stored_jobs(db) == ["Pod/job-0"]
    assert "warning: 1 series rejected (invalid_pod): pod 'job-1/../x' (not a Kubernetes name)" in out.err


def test_on_the_bed_an_owner_name_no_job_key_can_hold_is_refused(
    testbed, kube_admin, namespace, prometheus, tmp_path: Path
) -> None:
    """An ownerReference's name is only required to be non-empty by the apiserver (it takes
    ``x/../y``): the job it would name is refused and counted, its pod is not audited as a bare
    pod either, and the clean pod beside it is."""
    import time
    import uuid
    from datetime import datetime, timezone

    from kubeobjects import create_pod

    case = f"hl{uuid.uuid4().hex[:8]}"
    owner = {
        "apiVersion": "example.com/v1",
        "kind": "Trainer",
        "metadata": {"name": "x/../y", "uid": str(uuid.uuid4())},
    }
    create_pod(kube_admin, namespace, "trainer-0", gpus=1, owner=owner)
    create_pod(kube_admin, namespace, "clean-0", gpus=1)
    end = int(time.time()) // 300 * 300 - 2 * 3600
    prometheus.backfill(_bed_history(case, namespace, ["trainer-0", "clean-0"], end))
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    result = _cycle(testbed, prometheus, store_url, case, datetime.fromtimestamp(end, timezone.utc))
    assert _stored(store_url, case) == ["Pod/clean-0"]
    assert result.rejected.counts.get("invalid_name") == 1
    assert any(w.startswith("1 pods rejected (invalid_name): name 'x/../y'") for w in result.warnings), result.warnings
