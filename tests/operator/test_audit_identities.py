"""``audit --kubeconfig`` and ``audit --no-kube`` of one window into one store count its GPU time
once (issue 12, item 6), through the CLI against the test bed's apiserver and Prometheus.

The report: a week of 16.1 GPU-hours instead of 8.05, over two teams, silently. The pods' job
through the API is ``Job/train`` of team ``research``; without the API each pod is its own
``Pod/<name>`` of team ``<namespace>``. In either order the week counts the GPU time once, under
the identity the API resolved.
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from kubeobjects import batch_job, replayed_job_pods

from auditor import traces
from auditor.cli.main import main
from auditor.store import Store
from auditor.store.reports import ReportStore

pytestmark = pytest.mark.testbed
INTERVAL = timedelta(seconds=15)


def _week_hours(store: Store, start: datetime, end: datetime) -> tuple[float, set[str]]:
    """GPU-hours and teams of the report's weeks covering ``[start, end)`` (Monday 00:00 UTC)."""
    monday = (start - timedelta(days=start.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
    hours, teams = 0.0, set()
    while monday < end:
        for g in ReportStore(store).week_groups(monday, monday + timedelta(days=7)):
            hours += g.gpu_hours
            teams.add(g.team)
        monday += timedelta(days=7)
    return hours, teams


@pytest.mark.parametrize("order", [("kube", "no-kube"), ("no-kube", "kube")])
def test_kubeconfig_and_no_kube_audits_of_one_window_count_it_once(
    testbed, kube_admin, namespace, prometheus, tmp_path, capsys, order
) -> None:
    case = f"ai{uuid.uuid4().hex[:8]}"
    trace = traces.load_trace("h200-demo-cluster")
    cycle = len(trace.steady("resnet50_bf16_training")) * INTERVAL
    duration = cycle * math.ceil(timedelta(minutes=30) / cycle)
    end = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=1)  # backfill wants the past
    job = batch_job(kube_admin, namespace, "train", labels={"team": "research"})
    replayed_job_pods(
        kube_admin,
        prometheus,
        namespace,
        job,
        case=case,
        phase="resnet50_bf16_training",
        end=end,
        duration=duration,
        interval=INTERVAL,
        labels={"team": "research"},
    )
    db = f"sqlite:///{tmp_path}/store.db"
    start = end - duration - timedelta(minutes=5)
    common = [
        "audit",
        "--prometheus",
        prometheus.url,
        "--match",
        f"case={case}",
        "--start",
        start.isoformat(),
        "--end",
        end.isoformat(),
        "--db",
        db,
        "--output",
        "json",
    ]
    modes = {"kube": ["--kubeconfig", testbed.kubeconfig], "no-kube": ["--no-kube"]}

    assert main(common + modes[order[0]]) == 0, capsys.readouterr().err
    capsys.readouterr()
    with Store.open(db) as store:
        once, _ = _week_hours(store, start, end)
    assert once == pytest.approx(8 * duration.total_seconds() / 3600, rel=0.01)

    assert main(common + modes[order[1]]) == 0
    err = capsys.readouterr().err
    # said, not silent: the API's identity takes the GPU time over, or keeps it against a guess
    assert "two job identities" in err
    assert ("now owns it" if order[1] == "kube" else "resolved through the Kubernetes API; not stored again") in err
    with Store.open(db) as store:
        hours, teams = _week_hours(store, start, end)
        jobs = sorted(s["job"] for s in store.summaries())
    assert hours == pytest.approx(once, abs=1e-6)
    assert (teams, jobs) == ({"research"}, ["Job/train"])
