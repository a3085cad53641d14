"""A store as the console sees it after a few cycles: the demo cluster audited, plus what the
operator's other stages write (a violation climbing its ladder, actions with outcomes, Kueue
admission facts, report deliveries, an acknowledgement) and a job with a hostile team label.

Everything at an injected ``NOW``; the same writes the operator makes, through the store's own
modules (no SQL here)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from auditor.cli.demo import scenario
from auditor.core.admission import AdmissionFacts
from auditor.core.gate import AckKind, LineageRun
from auditor.core.identity import JobKey
from auditor.core.lineage import LineageKey
from auditor.core.model import JobRef
from auditor.engine import run_audit
from auditor.sources.replay import ReplaySource
from auditor.store import Store
from auditor.store.admissions import AdmissionStore
from auditor.store.decisions import DONE, FAILED, DecisionStore
from auditor.store.lineage import AckLog, LineageRecorder
from auditor.store.reports import ReportStore
from tests.fake_clock import FakeClock

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)
CLUSTER = "demo"
#: a team label as hostile as a cluster can make it
HOSTILE_TEAM = '<script>window.pwned=1</script>"><img src=x onerror="window.pwned=2">'
FINETUNE = ("llm", "PyTorchJob", "llm-finetune")
HELD_LINEAGE = "nightly-sweep"


def fill(store: Store, now: datetime = NOW) -> dict[str, int]:
    """Fill ``store``; returns the ids of the jobs the tests look at."""
    sc = scenario(now, interval=timedelta(minutes=2))
    source = ReplaySource(sc.feeds, end=now, duration=sc.duration, interval=sc.interval)
    run_audit(source, sc.resolver, store, sc.window, now=now, clock=FakeClock(now))
    found = store.find_job(*FINETUNE, cluster=CLUSTER)
    assert found is not None
    finetune = found[0]

    ledger = DecisionStore(store)
    job = JobKey(CLUSTER, *FINETUNE)
    opened = now - timedelta(hours=3)
    state = ledger.open_violation(job, "high-util-low-sm", opened, {"verdict": "low_sm_efficiency"})
    did = ledger.claim_step(
        job,
        "high-util-low-sm",
        state,
        0,
        dedup_key="k#s0",
        mode="enforce",
        action_names=["annotate", "notify"],
        action_keys=["k#s0#annotate", "k#s0#notify"],
        now=opened,
        dry_run=False,
        verdict="low_sm_efficiency",
        reason="SM active 4 % while busy 78 % for 3 h",
        evidence={},
    )
    assert did is not None
    ledger.finish_action("k#s0#annotate", DONE, opened + timedelta(seconds=2), result={"annotated": True})
    ledger.finish_action("k#s0#notify", FAILED, opened + timedelta(seconds=3), error="slack: 503 Service Unavailable")

    AdmissionStore(store).record(
        [
            (
                finetune,
                AdmissionFacts(
                    workload="pytorchjob-llm-finetune-3f2a1",
                    created=now - timedelta(hours=4, minutes=10),
                    local_queue="llm-queue",
                    cluster_queue="gpu-cluster-queue",
                    quota_reserved_at=now - timedelta(hours=4, minutes=2),
                    admitted_at=now - timedelta(hours=4, minutes=2),
                    queue_wait_s=480.0,
                    last_admitted_at=now - timedelta(hours=4, minutes=2),
                    last_wait_s=480.0,
                ),
            )
        ],
        now,
    )

    reports = ReportStore(store)
    for team, ok in (("llm", True), ("vision", False)):
        key = f"{CLUSTER}/2026-W48/{team}/slack"
        assert reports.claim(
            dedup_key=key,
            cluster=CLUSTER,
            week="2026-W48",
            team=team,
            channel="slack",
            now=now,
            holder="test",
            claim_timeout=timedelta(minutes=5),
            max_attempts=3,
        )
        reports.finish(key, ok=ok, now=now, holder="test", error=None if ok else "webhook: timed out", detail={})

    # earlier runs of one lineage, flagged each time: the shipped gate rule holds it (3 of 5)
    held = LineageKey(CLUSTER, "llm", HELD_LINEAGE)
    for i in range(3):
        start = now - timedelta(days=3 - i)
        LineageRecorder(store).record(
            held,
            LineageRun(
                job=f"Job/{HELD_LINEAGE}-r{i}",
                verdict="low_sm_efficiency",
                start=start,
                end=start + timedelta(hours=1),
                uid=f"u-held-{i}",
                findings=("low_sm_efficiency",),
                gpu_hours=1.0,
                waste_gpu_hours=0.9,
                final=True,
            ),
            start + timedelta(hours=1),
            team="llm",
        )

    AckLog(store).acknowledge(
        LineageKey(CLUSTER, "vision", "resnet50-train"),
        "kube:bob",
        now + timedelta(days=7),
        "known: input pipeline fix in review",
        now - timedelta(hours=1),
        via="cli",
        kind=AckKind.ACK,
    )

    hostile = store.upsert_job(
        JobRef(cluster=CLUSTER, namespace="evil", kind="Job", name="label-test", uid="u-evil", team=HOSTILE_TEAM),
        now - timedelta(hours=1),
        now,
    )
    doc = dict(store.summary(finetune) or {})
    doc.update(namespace="evil", job="Job/label-test", uid="u-evil", team=HOSTILE_TEAM, findings=[])
    store.save_summary(hostile, doc)
    return {"finetune": finetune, "hostile": hostile}
