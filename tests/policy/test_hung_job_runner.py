"""The shipped hung-job policy through the policy runner (issue 33, part 4, the fast path): a
2-GPU job replaying the recorded hang (h200-hang's ``hung_spin_2sm`` on both GPUs) gets its one
step — annotate, Event, alert — on the first cycle the hang holds, and nothing more on the cycles
after: alerted once, without the ladder's pacing. The runner is driven through the fakes of its
ports (tests/policy/test_policy_runner_fast.py) and a store holding the replayed buckets."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from importlib import resources
from pathlib import Path

from test_policy_runner_fast import FakeCluster, FakeRecord

from auditor.core.job_summary import JobSummary
from auditor.core.model import Bucket, JobRef, PodRef, Window
from auditor.core.summary import summarize_job
from auditor.policy.loader import parse_policies
from auditor.policy.runner import PolicyRunner, RunnerConfig
from auditor.sources.replay import ReplaySource
from auditor.traces import TraceJob, load_trace, make_gpus

END = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)  # bucket-aligned: the cycle's now
POLICY = Path(__file__).resolve().parents[2] / "policies" / "hung-job" / "policy.yaml"


class BucketStore:
    """The two reads the runner makes for sustained conditions: the job's id and its buckets."""

    def __init__(self, buckets: list[Bucket]) -> None:
        self._buckets = buckets

    def find_job(self, namespace: str, kind: str, name: str, cluster: str) -> tuple[int]:
        return (1,)

    def buckets(self, job_id: int, window: Window) -> list[Bucket]:
        return [b for b in self._buckets if window.start <= b.start and b.end <= window.end]


def test_a_hung_job_is_alerted_once_on_the_first_cycle_the_hang_holds() -> None:
    trace = load_trace(str(resources.files("auditor").joinpath("data", "h200-hang.csv")))
    pod = PodRef("ml", "hung-0")
    src = ReplaySource(
        [(trace, [TraceJob(pod, make_gpus(2, "node-hung"), "hung_spin_2sm")])],
        end=END,
        duration=timedelta(minutes=30),
        interval=timedelta(seconds=5),
    )
    window = Window(END - timedelta(hours=1), END)
    buckets = list(src.read(window, timedelta(minutes=5)).buckets)
    job = JobRef("east", "ml", "PyTorchJob", "hung", team="t")
    summary = JobSummary.from_json(summarize_job(job, buckets, window=window, now=END, interval=5.0).to_json(), "test")
    assert summary.verdict.value == "low_sm_efficiency"

    record, kube = FakeRecord(), FakeCluster()
    runner = PolicyRunner(
        parse_policies(POLICY.read_text(), str(POLICY)),
        store=BucketStore(buckets),
        kube=kube,
        config=RunnerConfig(cluster="east"),
        record=record,
    )
    (first,) = runner.run_cycle([summary], now=END, act=True)
    assert first.policy == "hung-job" and first.step == 0
    assert first.actions == ["annotate", "event", "notify"]
    assert "2 of 2 GPUs" in first.reason
    for minutes in (5, 30, 24 * 60):
        (later,) = runner.run_cycle([summary], now=END + timedelta(minutes=minutes), act=True)
        assert later.step is None  # the ladder has one step: nothing is sent again
    assert kube.calls == [("annotate", "PyTorchJob/hung"), ("event", "PyTorchJob/hung")]
    assert [d["step"] for d in record.decision_rows] == [0]
