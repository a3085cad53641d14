"""A sustained condition reads the job's trailing window only: the cost of a policy cycle does not
grow with the age of the jobs (issue 4), and a month-old job is judged like an hour-old one."""

from __future__ import annotations

from datetime import timedelta

from counting import CountingStore
from test_policy_units import SUM, P

from auditor.core.job_summary import JobSummary
from auditor.core.model import JobRef
from auditor.policy.examples import NOW, example_buckets
from auditor.policy.loader import parse_policies
from auditor.policy.runner import PolicyRunner
from auditor.store import Store


def test_sustained_reads_only_the_trailing_window_of_an_old_job(tmp_path) -> None:
    policies = parse_policies(P, "p.yaml")  # sustained: 30 minutes of sm_active <= 0.3
    with Store.open(f"sqlite:///{tmp_path}/s.db") as store:
        reads = {}
        for hours in (2, 48):
            job = JobRef("c", "n", "Job", f"j{hours}", None, "t")
            jid = store.upsert_job(job, NOW - timedelta(hours=hours), NOW)
            buckets = example_buckets({"gpu_util": 0.95, "sm_active": 0.1, "minutes": hours * 60})
            store.replace_buckets(jid, buckets)
            summary = JobSummary.example(
                **{
                    **SUM,
                    "cluster": "c",
                    "job": job.job,
                    "gpu_util": 0.95,
                    "coverage": 0.99,
                    "start": (NOW - timedelta(hours=hours)).isoformat(),
                    "end": NOW.isoformat(),
                }
            )
            counting = CountingStore(store)
            (decision,) = PolicyRunner(policies, counting).run_cycle([summary], now=NOW, act=False)
            # only a firing policy yields a decision; it held for the whole trailing 30 minutes
            assert decision.policy == "p" and "for 30" in decision.reason, decision.reason
            assert decision.evidence["sustained"]["buckets_covered"] == 6
            reads[hours] = counting.read
        assert reads[48] == reads[2] > 0
