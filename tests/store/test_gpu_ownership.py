"""GPU time is owned once, by GPU and time, whatever job identity an audit gave it (issue 12, item 6).

The report: ``audit --kubeconfig`` and ``audit --no-kube`` of one window into one store gave a
week of 16.1 GPU-hours instead of 8.05, over two teams, silently. Here the two audits are the
engine with the two resolvers' identities (the pods' job through the API; ``Pod/<name>`` without
it), into one store (SQLite, and PostgreSQL on the test bed), read back by the weekly report.
The later audit's identity wins, except that a guess (``Pod/<name>``, no uid) never replaces
one the API resolved.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from auditor.core.model import JobRef, PodRef, Window
from auditor.correlate import NoKubeResolver, StaticResolver
from auditor.engine import run_audit
from auditor.sources.replay import ReplaySource
from auditor.store import Store
from auditor.store.reports import ReportStore
from auditor.traces import TraceJob, load_trace, make_gpus

END = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)  # a Wednesday
WEEK = (datetime(2026, 11, 23, tzinfo=timezone.utc), datetime(2026, 11, 30, tzinfo=timezone.utc))
WINDOW = Window(END - timedelta(hours=1), END)
PODS = [PodRef("ml", "train-0"), PodRef("ml", "train-1")]
TRAIN = JobRef("default", "ml", "Job", "train", uid="u-1", team="research")


def source(pods: list[PodRef] = PODS, host: str = "n1") -> ReplaySource:
    tr = load_trace("h200-demo-cluster")
    jobs = [TraceJob(p, make_gpus(4, f"{host}-{k}"), "resnet50_bf16_training") for k, p in enumerate(pods)]
    return ReplaySource([(tr, jobs)], end=END, duration=timedelta(hours=1))


#: ``audit --kubeconfig``: both pods are the Job ``train`` of team research
KUBE = StaticResolver({(p.namespace, p.pod): TRAIN for p in PODS}, fallback=None)
#: ``audit --no-kube``: each pod is its own job ``Pod/<name>``, its team the namespace
NO_KUBE = NoKubeResolver("default")


def week(store: Store) -> tuple[float, set[str]]:
    groups = ReportStore(store).week_groups(*WEEK)
    return sum(g.gpu_hours for g in groups), {g.team for g in groups}


def test_no_kube_after_kubeconfig_counts_the_window_once_under_the_resolved_job(store_url: str) -> None:
    """The report's order: the API's identity stays, the guess is not stored, and it says so."""
    with Store.open(store_url) as store:
        run_audit(source(), KUBE, store, WINDOW, now=END)
        hours, teams = week(store)
        assert (hours, teams) == (pytest.approx(8.0, abs=0.05), {"research"})  # 8 GPUs for an hour
        again = run_audit(source(), NO_KUBE, store, WINDOW, now=END)
        assert week(store) == (pytest.approx(hours, abs=1e-6), {"research"}), "GPU time counted under two identities"
        assert [s["job"] for s in store.summaries()] == ["Job/train"]
        assert again.summaries == []  # nothing of it is the guess's
        warned = [w for w in again.report.warnings if "two job identities" in w]
        assert len(warned) == 2 and all(
            "default/ml/Job/train, resolved through the Kubernetes API" in w
            and "not stored again as default/ml/Pod/train-" in w
            for w in warned
        )


def test_kubeconfig_after_no_kube_takes_the_window_over(store_url: str) -> None:
    with Store.open(store_url) as store:
        first = run_audit(source(), NO_KUBE, store, WINDOW, now=END)
        hours, teams = week(store)
        assert (hours, teams) == (pytest.approx(8.0, abs=0.05), {"ml"})
        again = run_audit(source(), KUBE, store, WINDOW, now=END)
        assert week(store) == (pytest.approx(hours, abs=1e-6), {"research"})
        assert [s["job"] for s in store.summaries()] == [s.job for s in again.summaries] == ["Job/train"]
        warned = [w for w in again.report.warnings if "two job identities" in w]
        assert len(warned) == 2 and all("now owns it" in w for w in warned)
        assert all(s.key.name in " ".join(warned) for s in first.summaries)
        # a third audit with the same identity moves nothing and warns about nothing
        third = run_audit(source(), KUBE, store, WINDOW, now=END)
        assert not [w for w in third.report.warnings if "two job identities" in w]
        assert week(store)[0] == pytest.approx(hours, abs=1e-6)


def test_between_two_resolved_identities_the_later_audit_wins(store_url: str) -> None:
    """A pod re-parented (or a resolver that now stops at another owner): both have a uid."""
    other = JobRef("default", "ml", "PyTorchJob", "train", uid="u-2", team="vision")
    with Store.open(store_url) as store:
        run_audit(source(), KUBE, store, WINDOW, now=END)
        hours, _ = week(store)
        res = run_audit(source(), StaticResolver({(p.namespace, p.pod): other for p in PODS}), store, WINDOW, now=END)
        assert week(store) == (pytest.approx(hours, abs=1e-6), {"vision"})
        assert [s["job"] for s in store.summaries()] == ["PyTorchJob/train"]
        assert [w for w in res.report.warnings if "now owns it" in w]


def test_a_later_audit_of_part_of_the_window_takes_over_only_that_part(store_url: str) -> None:
    """The older identity keeps the GPU time the newer audit did not see, re-summarized."""
    with Store.open(store_url) as store:
        run_audit(source(), NO_KUBE, store, WINDOW, now=END)
        total = week(store)[0]
        pod_id, _ = store.find_job("ml", "Pod", "train-0")
        store.save_summary(pod_id, {**store.summary(pod_id), "final": True, "kube": {"phase": "Succeeded"}})
        half = Window(WINDOW.start + timedelta(minutes=30), WINDOW.end)
        run_audit(source(), KUBE, store, half, now=END)
        by_job = {s["job"]: s["gpu_hours"] for s in store.summaries()}
        assert set(by_job) == {"Job/train", "Pod/train-0", "Pod/train-1"}
        assert by_job["Job/train"] == pytest.approx(total / 2, abs=0.05)
        assert sum(by_job.values()) == pytest.approx(total, abs=0.05)
        assert week(store)[0] == pytest.approx(total, abs=0.05)
        assert max(b.start for b in store.buckets(pod_id)) < half.start
        # what the engine does not compute (the operator's view of the job) stays with it
        assert (store.summary(pod_id)["final"], store.summary(pod_id)["kube"]) == (True, {"phase": "Succeeded"})


def test_pods_sharing_a_gpu_are_not_one_identity(store_url: str) -> None:
    """Time-slicing: two pods of two jobs on one GPU both keep their (divided) GPU time."""
    tr = load_trace("h200-demo-cluster")
    gpu = make_gpus(1, "n9")
    feeds = [
        (
            tr,
            [
                TraceJob(PodRef("a", "left"), gpu, "resnet50_bf16_training"),
                TraceJob(PodRef("b", "right"), gpu, "resnet50_bf16_training"),
            ],
        )
    ]
    src = ReplaySource(feeds, end=END, duration=timedelta(hours=1))
    with Store.open(store_url) as store:
        res = run_audit(src, NO_KUBE, store, WINDOW, now=END)
        assert not [w for w in res.report.warnings if "two job identities" in w]
        assert sorted((s["job"], s["gpu_hours"]) for s in store.summaries()) == [
            ("Pod/left", pytest.approx(0.5, abs=0.01)),
            ("Pod/right", pytest.approx(0.5, abs=0.01)),
        ]


def test_other_clusters_pods_of_the_same_name_are_theirs(store_url: str) -> None:
    with Store.open(store_url) as store:
        run_audit(source(), NoKubeResolver("east"), store, WINDOW, now=END)
        res = run_audit(source(), NoKubeResolver("west"), store, WINDOW, now=END)
        assert not [w for w in res.report.warnings if "two job identities" in w]
        assert sorted(s["cluster"] for s in store.summaries()) == ["east", "east", "west", "west"]


def test_upgrade_to_0006_records_the_owners_of_stored_buckets(store_url: str) -> None:
    from revisions import store_at

    from auditor.store.tables import BucketRow, JobRow, PodOwnerRow

    with Store.open("sqlite://") as ref:
        run_audit(source(), NO_KUBE, ref, WINDOW, now=END)
        with ref._engine.connect() as conn:
            rows = {
                t: [dict(r) for r in conn.execute(sa.select(t)).mappings()]
                for t in (JobRow.__table__, BucketRow.__table__)
            }
            owners = sorted(tuple(r) for r in conn.execute(sa.select(PodOwnerRow.__table__)).all())
    assert len(owners) == 2
    # ids past the ones the new store hands out (explicit ids leave PostgreSQL's sequence behind)
    for r in rows[JobRow.__table__]:
        r["id"] += 1000
    for r in rows[BucketRow.__table__]:
        r["job_id"] += 1000
    owners = sorted((c, ns, pod, jid + 1000, lo, hi) for c, ns, pod, jid, lo, hi in owners)
    store_at(store_url, "0005", rows)
    with Store.open(store_url) as store:
        with store._engine.connect() as conn:
            assert sorted(tuple(r) for r in conn.execute(sa.select(PodOwnerRow.__table__)).all()) == owners
        # the next audit under the other identity finds them and takes the GPU time over
        res = run_audit(source(), KUBE, store, WINDOW, now=END)
        assert [w for w in res.report.warnings if "two job identities" in w]
        assert [s["job"] for s in store.summaries()] == ["Job/train"]
