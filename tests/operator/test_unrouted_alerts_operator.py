"""The operator counts policy alerts that have nowhere to go (issue 12, item 10), end to end.

One operator cycle on the test bed (real apiserver, Prometheus with a backfilled one-SM spin,
SQLite store) over two bare GPU pods of a team that has no Slack or webhook route: both alerts
are recorded as skipped, the log warns once for the team, and the operator's own /metrics
registry counts two.
"""

from __future__ import annotations

import logging
import math
import re
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from kubeobjects import create_pod
from operator_settings import NOTIFY_LOW_SM, operator_settings

from auditor import traces
from auditor.core.model import PodRef
from auditor.operator_loop import Operator
from auditor.store.decisions import DecisionStore

pytestmark = pytest.mark.testbed

INTERVAL = timedelta(seconds=15)


def test_operator_counts_alerts_without_destination(
    testbed, kube_admin, namespace, prometheus, tmp_path, caplog, monkeypatch
) -> None:
    for var in ("GPU_AUDITOR_SLACK_WEBHOOK_URL", "GPU_AUDITOR_WEBHOOK_URL", "GPU_AUDITOR_DATABASE_URL"):
        monkeypatch.delenv(var, raising=False)
    case = f"ua{uuid.uuid4().hex[:8]}"
    trace = traces.load_trace("h200-microbench")
    cycle = len(trace.steady("one_sm_spin")) * INTERVAL
    duration = cycle * math.ceil(timedelta(minutes=30) / cycle)
    end = datetime.now(timezone.utc).replace(microsecond=0)
    jobs = []
    for k, name in enumerate(("spin-a", "spin-b")):
        create_pod(
            kube_admin, namespace, name, gpus=1, labels={"team": "nohook"}, node=f"{case}-n{k}", started=end - duration
        )
        jobs.append(
            traces.TraceJob(
                PodRef(namespace, name, "main"), traces.make_gpus(1, f"{case}-n{k}"), "one_sm_spin", duration=duration
            )
        )
    text = traces.trace_to_openmetrics(trace, jobs, end=end, duration=duration, interval=INTERVAL)
    prometheus.backfill(re.sub(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{", rf'\1{{case="{case}",', text, flags=re.M))

    settings = operator_settings(
        tmp_path,
        policy=NOTIFY_LOW_SM,
        kubernetes={"kubeconfig": testbed.kubeconfig},
        prometheus={"url": prometheus.url, "matchers": {"case": case}, "label_convention": "pod"},
    )
    op = Operator(settings)
    try:
        with caplog.at_level(logging.WARNING, logger="auditor.policy.runner"):
            result = op.run_once()
        skipped = DecisionStore(op.store).actions(states=["skipped"])
    finally:
        op.shutdown()

    assert sorted(s.job for s in result.summaries if s.namespace == namespace) == ["Pod/spin-a", "Pod/spin-b"]
    assert sorted(r.job.name for r in skipped) == ["spin-a", "spin-b"]
    assert all(r.action == "notify" and r.result["reason"] == "no_destination" for r in skipped)
    warned = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert len(warned) == 1 and "team nohook " in warned[0], warned
    value = op.metrics.registry.get_sample_value(
        "gpu_auditor_policy_alerts_undelivered_total", {"team": "nohook", "reason": "no_destination"}
    )
    assert value == 2.0

    # the per-team series of that real cycle (tests/operator/test_fleet_metrics.py has the rest):
    # the team's GPU-hours accrued, its two jobs now, their two alerts skipped in the store
    samples = [(s.name, s.labels, s.value) for fam in op.metrics.registry.collect() for s in fam.samples]

    def total(name: str, **labels: str) -> float:
        return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items()))

    assert total("gpu_auditor_gpu_hours_total", cluster="t", team="nohook") > 0
    assert total("gpu_auditor_team_jobs", cluster="t", team="nohook") == 2
    assert total("gpu_auditor_policy_action_states", cluster="t", action="notify", state="skipped") == 2
    assert not [lab for _, lab, _ in samples if "pod" in lab or "job" in lab]
