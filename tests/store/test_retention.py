"""Store retention (issue 12, items 4 and 11) on SQLite and the test bed's PostgreSQL.

Two clusters, ``east`` and ``west``, share one store, as several clusters share one PostgreSQL
in production: each cluster's prune must delete exactly its own aged-out rows, by the rules of
auditor/store/retention.py, and nothing a running job or an open escalation still needs.
Every time is fixed (``NOW``); nothing depends on the wall clock.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from auditor.cli.main import main
from auditor.core.accumulate import JobAggregate
from auditor.core.identity import JobKey
from auditor.core.metrics import Metric
from auditor.core.model import Bucket, GpuId, JobRef, PodRef, Window
from auditor.errors import BadInput
from auditor.store import Store
from auditor.store.decisions import DONE, WAITING, DecisionStore
from auditor.store.reports import ReportStore
from auditor.store.retention import DELIVERY_FLOOR, FINAL_STATES, OPERATOR_ORIGIN, TABLE_ORDER, Retention, prune

UTC = timezone.utc
NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
W = timedelta(minutes=5)
DAY = timedelta(days=1)
RET = Retention(buckets=timedelta(days=35), summaries=timedelta(days=400))


@pytest.fixture
def store(store_url: str):
    s = Store.open(store_url)
    yield s
    s.close()


def _bucket(start: datetime, pod: str = "p-0") -> Bucket:
    return Bucket(
        PodRef("ml", pod),
        GpuId(uuid=f"GPU-{pod}", model="NVIDIA H200"),
        Metric.SM_ACTIVE,
        start,
        start + W,
        3.0,
        10,
        0.2,
        0.4,
    )


def _summary(cluster: str, name: str, end: datetime | None, computed: datetime) -> dict:
    return {
        "cluster": cluster,
        "namespace": "ml",
        "job": f"Job/{name}",
        "team": "vision",
        "verdict": "healthy",
        "start": None if end is None else (end - timedelta(hours=1)).isoformat(),
        "end": None if end is None else end.isoformat(),
        "computed_at": computed.isoformat(),
        "gpu_hours": 1.0,
    }


def _job(
    store: Store,
    cluster: str,
    name: str,
    *,
    seen: datetime,
    buckets: list[datetime] = (),
    summary_end: datetime | None = None,
    ended: datetime | None = None,
    through: datetime | None = None,
) -> int:
    jid = store.upsert_job(JobRef(cluster, "ml", "Job", name, team="vision"), seen - timedelta(hours=1), seen)
    if buckets:
        store.replace_buckets(jid, [_bucket(t, pod=f"{name}-0") for t in buckets])  # a pod is one job's
    if summary_end is not None:
        store.save_summary(jid, _summary(cluster, name, summary_end, summary_end))
    if through is not None:
        agg = JobAggregate()
        agg.freeze(through)
        store.save_aggregate(jid, agg, through)
    if ended is not None:
        store.set_job_ended(jid, ended)
    return jid


def _run(store: Store, cluster: str | None, finished: datetime, *, operator: bool, status: str = "ok") -> int:
    detail: dict = {"origin": OPERATOR_ORIGIN} if operator else {}
    if cluster is not None:
        detail["cluster"] = cluster
    return store.record_run(
        Window(finished - W, finished), finished, finished, jobs=1, queries=1, status=status, detail=detail
    )


def _episode(
    store: Store, cluster: str, name: str, *, at: datetime, close: bool, state: str = DONE, seen: datetime | None = None
) -> None:
    """One violation of ``name`` opened at ``at`` with its first step decided and its action in
    ``state``; closed at ``at``, or still firing at ``seen``."""
    repo = DecisionStore(store)
    job = JobKey(cluster, "ml", "Job", name)
    v = repo.open_violation(job, "low-sm", at, {})
    key = f"{cluster}/ml/Job/{name}#low-sm#v{v.episode}#s0"
    assert (
        repo.claim_step(
            job,
            "low-sm",
            v,
            0,
            dedup_key=key,
            mode="enforce",
            action_names=["requeue"],
            action_keys=[key + "#requeue"],
            now=at,
            dry_run=False,
            verdict="low_sm_efficiency",
            reason="r",
            evidence={},
        )
        is not None
    )
    repo.finish_action(key + "#requeue", state, at)
    if close:
        repo.close_violation(job, "low-sm", at)
    elif seen is not None:
        repo.open_violation(job, "low-sm", seen, {})


def _delivery(store: Store, cluster: str, week: str, at: datetime) -> None:
    rs = ReportStore(store)
    key = f"{cluster}#{week}#*#slack"
    assert rs.claim(
        dedup_key=key,
        cluster=cluster,
        week=week,
        team="*",
        channel="slack",
        now=at,
        holder="h",
        claim_timeout=timedelta(minutes=15),
        max_attempts=5,
    )
    rs.finish(key, ok=True, now=at, holder="h", error=None, detail={})


def _fill(store: Store, cluster: str) -> dict[str, int]:
    """One cluster's rows, each a case of the rules; returns the job ids by name."""
    old, mid = NOW - timedelta(days=500), NOW - timedelta(days=100)
    ids = {
        # ended long ago: bucket, summary, aggregate and the job itself go
        "gone": _job(store, cluster, "gone", seen=old, buckets=[old - W], summary_end=old, ended=old, through=old),
        # ended 100 days ago: its buckets and aggregate go, its summary and job stay
        "ended": _job(store, cluster, "ended", seen=mid, buckets=[mid - W], summary_end=mid, ended=mid, through=mid),
        # still running, not folded since 40 days ago (the operator was down): the folded bucket
        # goes, the two unfolded ones (from 38 days ago on) stay until a cycle folds them
        "running": _job(
            store,
            cluster,
            "running",
            seen=NOW,
            summary_end=NOW - 40 * DAY,
            through=NOW - 40 * DAY,
            buckets=[NOW - 50 * DAY, NOW - 38 * DAY, NOW - 2 * W],
        ),
        # a one-shot audit's job (no aggregate, never ended): old buckets go, the job stays
        "audited": _job(
            store,
            cluster,
            "audited",
            seen=NOW - 40 * DAY,
            buckets=[NOW - 40 * DAY, NOW - 34 * DAY],
            summary_end=NOW - 40 * DAY,
        ),
    }
    _run(store, cluster, NOW - 700 * DAY, operator=True)  # an old cycle: goes
    _run(store, cluster, NOW - 600 * DAY, operator=False)  # a one-shot audit: goes
    _run(store, cluster, NOW - 500 * DAY, operator=True)  # the newest successful cycle (the cursor): stays
    _run(store, cluster, NOW - 450 * DAY, operator=True, status="failed")  # failed, old: goes
    _episode(store, cluster, "gone", at=old, close=True)  # closed long ago: violation, decision, action go
    _episode(store, cluster, "running", at=old, close=False, seen=NOW - DAY)  # still firing: stays
    _episode(store, cluster, "ended", at=old, close=True, state=WAITING)  # a requeue not reactivated: stays
    _delivery(store, cluster, "2025-W20", old)  # goes
    _delivery(store, cluster, "2026-W48", NOW - DAY)  # stays
    return ids


EXPECTED = {
    "gpu_buckets": 4,  # gone's, ended's, running's folded one, audited's older one
    "gpu_pod_owners": 2,  # gone's and ended's pods: no bucket of theirs left
    "job_summaries": 1,
    "job_aggregates": 2,
    "jobs": 1,
    "audit_runs": 3,
    "policy_actions": 1,
    "policy_decisions": 1,
    "policy_violations": 1,
    "report_deliveries": 1,
}


def _counts(store_url: str) -> dict[str, dict[str, int]]:
    """Rows per table per cluster, read with plain SQL (not through the code under test)."""
    engine = sa.create_engine(store_url.replace("postgresql://", "postgresql+psycopg://", 1))
    out: dict[str, dict[str, int]] = {}
    with engine.connect() as conn:
        for cluster in ("east", "west"):
            c = {"c": cluster}
            out[cluster] = {
                "gpu_buckets": conn.execute(
                    sa.text("SELECT count(*) FROM gpu_buckets b JOIN jobs j ON j.id = b.job_id WHERE j.cluster = :c"), c
                ).scalar_one(),
                "job_aggregates": conn.execute(
                    sa.text(
                        "SELECT count(*) FROM job_aggregates a JOIN jobs j ON j.id = a.job_id WHERE j.cluster = :c"
                    ),
                    c,
                ).scalar_one(),
                **{
                    t: conn.execute(sa.text(f"SELECT count(*) FROM {t} WHERE cluster = :c"), c).scalar_one()
                    for t in (
                        "gpu_pod_owners",
                        "job_summaries",
                        "jobs",
                        "policy_actions",
                        "policy_decisions",
                        "policy_violations",
                        "report_deliveries",
                    )
                },
                "audit_runs": sum(
                    1
                    for (d,) in conn.execute(sa.text("SELECT detail FROM audit_runs"))
                    if (json.loads(d) if isinstance(d, str) else d).get("cluster") == cluster
                ),
            }
    engine.dispose()
    return out


def test_prune_deletes_per_table_rules_for_one_cluster_only(store: Store, store_url: str) -> None:
    east, west = _fill(store, "east"), _fill(store, "west")
    before = _counts(store_url)

    dry = prune(store, NOW, RET, cluster="east", dry_run=True)
    assert dry.deleted == EXPECTED and tuple(dry.deleted) == TABLE_ORDER
    assert _counts(store_url) == before  # a dry run deletes nothing

    real = prune(store, NOW, RET, cluster="east")
    assert real.deleted == EXPECTED  # exactly what the dry run counted
    after = _counts(store_url)
    assert after["west"] == before["west"]  # the other cluster is untouched
    assert after["east"] == {t: before["east"][t] - EXPECTED[t] for t in TABLE_ORDER}
    assert prune(store, NOW, RET, cluster="east").total == 0  # idempotent

    # what stays, job by job
    assert store.find_job("ml", "Job", "gone", "east") is None
    assert store.find_job("ml", "Job", "ended", "east") is not None and store.summary(east["ended"]) is not None
    assert store.buckets(east["ended"]) == [] and store.aggregate(east["ended"]) is None
    assert [b.start for b in store.buckets(east["running"])] == [NOW - 38 * DAY, NOW - 2 * W]
    assert store.aggregate(east["running"]) is not None
    assert [b.start for b in store.buckets(east["audited"])] == [NOW - 34 * DAY]
    repo = DecisionStore(store)
    assert {a.job.name: a.state for a in repo.actions() if a.job.cluster == "east"} == {
        "running": DONE,
        "ended": WAITING,
    }
    assert [r["week"] for r in ReportStore(store).deliveries(cluster="east")] == ["2026-W48"]
    cursor = [r for r in store.runs() if r["detail"].get("cluster") == "east"]
    assert [(r["status"], r["finished"]) for r in cursor] == [("ok", NOW - 500 * DAY)]

    # west's own prune then removes the same from west
    assert prune(store, NOW, RET, cluster="west").deleted == EXPECTED
    assert _counts(store_url)["west"] == after["east"]
    assert store.find_job("ml", "Job", "gone", "west") is None and west["running"] != east["running"]


def test_every_cluster_at_once_and_runs_without_a_cluster(store: Store, store_url: str) -> None:
    _fill(store, "east")
    _fill(store, "west")
    legacy = _run(store, None, NOW - 600 * DAY, operator=False)  # recorded before runs named their cluster
    assert prune(store, NOW, RET, cluster="east").deleted["audit_runs"] == 3
    assert legacy in [r["id"] for r in store.runs()]  # a cluster's prune leaves it alone
    both = prune(store, NOW, RET, cluster=None)
    assert both.deleted == {**EXPECTED, "audit_runs": 3 + 1}
    assert legacy not in [r["id"] for r in store.runs()]


def test_deliveries_are_kept_past_a_short_retention_until_they_cannot_matter(store: Store) -> None:
    _delivery(store, "east", "2026-W47", NOW - 10 * DAY)
    short = Retention(buckets=DAY, summaries=DAY)
    # 10 days ago: still inside DELIVERY_FLOOR, so deleting it could let the week go out twice
    assert prune(store, NOW, short, cluster="east").deleted["report_deliveries"] == 0
    later = NOW - 10 * DAY + DELIVERY_FLOOR
    assert prune(store, later, short, cluster="east").deleted["report_deliveries"] == 1


def test_apply_retention_is_the_same_prune(store: Store, store_url: str) -> None:
    _fill(store, "east")
    _fill(store, "west")
    n = store.apply_retention(NOW, bucket_retention=RET.buckets, summary_retention=RET.summaries, cluster="west")
    assert n == sum(EXPECTED.values())
    assert _counts(store_url)["east"]["gpu_buckets"] == 7


def test_bad_retention_and_times_are_refused() -> None:
    with pytest.raises(BadInput, match="store.retention.buckets must be positive"):
        Retention(buckets=timedelta(0), summaries=DAY)
    with pytest.raises(BadInput, match="store.retention.summaries must be positive"):
        Retention(buckets=DAY, summaries=-DAY)


def test_store_prune_command_reads_the_settings_and_prints_per_table(
    store: Store, store_url: str, tmp_path, capsys, monkeypatch
) -> None:
    _fill(store, "east")
    _fill(store, "west")
    before = _counts(store_url)
    config = tmp_path / "settings.yaml"
    config.write_text(f"cluster: east\nstore:\n  url: {store_url}\n  retention: {{buckets: 35d, summaries: 400d}}\n")
    monkeypatch.delenv("GPU_AUDITOR_DATABASE_URL", raising=False)
    monkeypatch.delenv("GPU_AUDITOR_CONFIG", raising=False)
    as_of = NOW.isoformat().replace("+00:00", "Z")

    assert main(["store", "prune", "--config", str(config), "--dry-run", "--as-of", as_of]) == 0
    out = capsys.readouterr().out
    assert "cluster east" in out and "WOULD DELETE" in out
    rows = {line.split()[0]: int(line.split()[1]) for line in out.splitlines()[2:]}
    assert rows == {**EXPECTED, "total": sum(EXPECTED.values())}
    assert _counts(store_url) == before

    # the environment overrides the file, as for every command: a longer retention deletes less
    monkeypatch.setenv("GPU_AUDITOR_STORE__RETENTION__SUMMARIES", "800d")
    assert main(["store", "prune", "--config", str(config), "--as-of", as_of, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cluster"] == "east" and doc["dry_run"] is False
    assert doc["deleted"] == {t: 0 for t in TABLE_ORDER} | {"gpu_buckets": 4, "gpu_pod_owners": 2, "job_aggregates": 2}
    assert _counts(store_url)["west"] == before["west"]

    with pytest.raises(SystemExit) as refused:  # argparse refuses the empty name (exit 2, naming --cluster)
        main(["store", "prune", "--config", str(config), "--cluster", "", "--as-of", as_of])
    assert refused.value.code == 2
    assert "--cluster" in capsys.readouterr().err
    assert main(["store", "prune", "--db", store_url, "--as-of", "yesterday"]) == 2


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_dry_run_counts_exactly_what_the_prune_deletes_on_random_stores(
    store: Store, store_url: str, seed: int
) -> None:
    """Random ages and states around the cut-offs: the prune deletes what the dry run counted
    (no cascade deletes more), nothing of the other cluster, and nothing a rule keeps."""
    import random

    rnd = random.Random(seed)

    def when() -> datetime:
        return NOW - timedelta(days=rnd.choice([1, 30, 36, 100, 399, 401, 600]))

    for cluster in ("east", "west"):
        for i in range(12):
            ended = rnd.random() < 0.5
            seen = when()
            _job(
                store,
                cluster,
                f"j{i}",
                seen=seen,
                buckets=sorted({when() for _ in range(3)}),
                summary_end=rnd.choice([None, seen]),
                ended=seen if ended else None,
                through=rnd.choice([None, when()]),
            )
            if rnd.random() < 0.7:
                _episode(
                    store,
                    cluster,
                    f"j{i}",
                    at=when(),
                    close=rnd.random() < 0.6,
                    state=rnd.choice([DONE, WAITING, "claimed", "failed"]),
                )
        for _ in range(3):
            _run(store, cluster, when(), operator=rnd.random() < 0.7, status=rnd.choice(["ok", "failed"]))
    repo = DecisionStore(store)
    unfinished = {a.dedup_key for a in repo.actions() if a.state not in FINAL_STATES}
    before = _counts(store_url)
    dry = prune(store, NOW, RET, cluster="east", dry_run=True)
    real = prune(store, NOW, RET, cluster="east")
    after = _counts(store_url)
    assert real.deleted == dry.deleted
    assert after["east"] == {t: before["east"][t] - dry.deleted[t] for t in TABLE_ORDER}
    assert after["west"] == before["west"]
    assert prune(store, NOW, RET, cluster="east").total == 0
    for jid, ref, _first, _last in store.open_jobs("east"):  # running jobs keep what is not folded yet
        agg = store.aggregate(jid)
        assert all(
            b.end > NOW - RET.buckets or (agg is not None and b.start >= agg.through) for b in store.buckets(jid)
        ), ref.name
    assert unfinished <= {a.dedup_key for a in repo.actions()}  # a restart must still finish these
