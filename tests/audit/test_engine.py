"""The engine wires source → resolver → (store) → summaries; same answers with and without a
store, idempotent re-audits, unattributed pods reported."""

from datetime import datetime, timedelta, timezone

import pytest

from auditor.core.job_summary import JobSummary, sorted_summaries
from auditor.core.model import JobRef, PodRef, Window
from auditor.correlate import NoKubeResolver, StaticResolver
from auditor.engine import run_audit
from auditor.sources.replay import ReplaySource
from auditor.traces import TraceJob, load_trace, make_gpus

END = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
WINDOW = Window(END - timedelta(hours=2), END)


def source() -> ReplaySource:
    tr = load_trace("h200-demo-cluster")
    jobs = [
        TraceJob(PodRef("a", "idle-nb"), make_gpus(1, "n1"), "notebook_idle_model_loaded"),
        TraceJob(PodRef("a", "train-0"), make_gpus(2, "n2"), "resnet50_bf16_training"),
        TraceJob(PodRef("b", "train-1"), make_gpus(2, "n3"), "resnet50_bf16_training", duration=timedelta(minutes=30)),
        TraceJob(PodRef("b", "spin"), make_gpus(1, "n4"), "kernel_spin_waiting_4_blocks"),
    ]
    return ReplaySource([(tr, jobs)], end=END, duration=timedelta(hours=1))


def docs(res) -> list[dict]:
    return [s.to_json() for s in res.summaries]


def test_no_store_no_kube():
    res = run_audit(source(), NoKubeResolver("c1"), None, WINDOW, now=END)
    assert res.run_id is None
    assert [s["job"] for s in docs(res)] == ["Pod/idle-nb", "Pod/spin", "Pod/train-0", "Pod/train-1"]
    assert all(s["cluster"] == "c1" for s in docs(res))
    assert {s["team"] for s in docs(res)} == {"a", "b"}
    assert res.report.scrape_interval == 15.0 and res.report.queries == 0


def test_resolver_groups_pods_and_reports_unattributed():
    job = JobRef("c1", "a", "PyTorchJob", "big", team="vision")
    resolver = StaticResolver({("a", "train-0"): job, ("b", "train-1"): job.__class__("c1", "b", "Job", "other")})
    res = run_audit(source(), resolver, None, WINDOW, now=END)
    assert sorted(s["job"] for s in docs(res)) == ["Job/other", "PyTorchJob/big"]
    assert any("could not be attributed" in w for w in res.report.warnings)


def test_sort_summaries():
    rows = [
        JobSummary.example(job="Job/a", waste_gpu_hours=None, gpu_hours=5),
        JobSummary.example(job="Job/b", waste_gpu_hours=1.0),
        JobSummary.example(job="Job/c", waste_gpu_hours=3.0),
    ]
    assert [r.job for r in sorted_summaries(rows)] == ["Job/c", "Job/b", "Job/a"]


def test_with_sqlite_store_same_results_and_idempotent(tmp_path):
    store_mod = pytest.importorskip("auditor.store")
    store = store_mod.Store.open(f"sqlite:///{tmp_path / 'a.sqlite'}")
    try:
        plain = run_audit(source(), NoKubeResolver(), None, WINDOW, now=END)
        first = run_audit(source(), NoKubeResolver(), store, WINDOW, now=END)
        again = run_audit(source(), NoKubeResolver(), store, WINDOW, now=END)
        assert docs(first) == docs(plain) == docs(again)
        assert first.run_id is not None and again.run_id != first.run_id
        stored = store.summaries()
        assert len(stored) == 4 and stored == docs(again)
        # a later, overlapping window: cumulative summaries cover the whole stored history
        later = Window(END - timedelta(minutes=30), END)
        cum = run_audit(source(), NoKubeResolver(), store, later, now=END, cumulative=True)
        by_job = {s["job"]: s for s in docs(cum)}
        assert by_job["Pod/train-0"]["gpu_hours"] == pytest.approx(2.0, abs=0.01)
        assert len(store.summaries()) == 4
    finally:
        store.close()


class Boom:
    def read(self, window, width):
        raise RuntimeError("source down")

    read_lazy = read


def test_failed_run_is_recorded_and_raised(tmp_path):
    store_mod = pytest.importorskip("auditor.store")
    store = store_mod.Store.open(f"sqlite:///{tmp_path / 'b.sqlite'}")
    try:
        with pytest.raises(RuntimeError):
            run_audit(Boom(), NoKubeResolver(), store, WINDOW, now=END)
    finally:
        store.close()
