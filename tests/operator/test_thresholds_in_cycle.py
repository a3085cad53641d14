"""The operator's cycles judge with the configured thresholds (settings ``thresholds:``), against
the test bed's real apiserver (discovery, informers) with a replayed H200 trace as the source.

The replayed pod is not in the API, so the operator audits it as ``Pod/<name>`` (its
``unresolved_pods`` default). Its data ends at the moment the test starts, so whatever the day
or hour, the first cycle's window (the last bucket or two before now) holds minutes of samples.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from operator_settings import operator_settings

from auditor.core.model import PodRef
from auditor.operator_loop import Operator
from auditor.sources.replay import ReplaySource
from auditor.store import Store
from auditor.traces import TraceJob, load_trace, make_gpus

pytestmark = pytest.mark.testbed


def _one_cycle(api, tmp_path, name: str, thresholds: dict | None) -> dict[str, dict]:
    now = datetime.now(timezone.utc).replace(microsecond=0)
    ns = f"th-{uuid.uuid4().hex[:8]}"
    trace = load_trace("h200-microbench")
    jobs = [TraceJob(PodRef(ns, "spin", "main"), make_gpus(1, f"{ns}-node"), "one_sm_spin")]
    source = ReplaySource([(trace, jobs)], end=now, duration=timedelta(minutes=30))
    settings = operator_settings(tmp_path / name, cluster=f"c-{name}", thresholds=thresholds or {})
    store = Store.open(f"sqlite:///{tmp_path / name}.db")
    try:
        result = Operator(settings, store=store, source=source, api=api).run_once()
        runs = store.runs(limit=1)
    finally:
        store.close()
    assert runs[0]["detail"]["thresholds"] == settings.thresholds.as_dict()
    return {s.job: s.to_json() for s in result.summaries if s.namespace == ns}


def test_cycle_uses_the_settings_thresholds(kube_admin, tmp_path):
    """One spinning thread block: SM activity 0.0076 is low_sm_efficiency with the built-in
    low_sm 0.5, and memory_bound once low_sm is 0.005 (no pipe does math)."""
    default = _one_cycle(kube_admin, tmp_path, "default", None)
    assert default["Pod/spin"]["verdict"] == "low_sm_efficiency"
    tuned = _one_cycle(kube_admin, tmp_path, "tuned", {"low_sm": 0.005})
    assert tuned["Pod/spin"]["verdict"] == "memory_bound"
    assert tuned["Pod/spin"]["sm_active"] == pytest.approx(default["Pod/spin"]["sm_active"])
