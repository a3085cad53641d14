"""Benchmark: how long store retention takes on a store that was never pruned, and an hour later.

Data (bulk-inserted, not audited), spread evenly over the 800 days before ``NOW``: ``--runs``
audit runs of two clusters (``east`` and ``west``, alternating), ``--jobs`` jobs of ``east``
with 50 five-minute buckets of one pod each, its pod ownership and an aggregate (two in three ended at their last bucket),
and ``--episodes`` escalation episodes of ``east`` (three in four closed; one decision and two
actions each, one in seven still waiting). Measured for ``east`` with the default retention
(35 days of buckets, 400 days of the rest): the dry run, the prune, and the prune one hour
later (what the operator's hourly job then finds).

    .venv/bin/python bench/retention_bench.py --db sqlite:////tmp/retention.db
    .venv/bin/python bench/retention_bench.py --db postgresql://USER:PW@HOST:PORT/EMPTY_DB
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime, timedelta, timezone

import sqlalchemy as sa

from auditor.store import Store
from auditor.store.decisions import actions, decisions, violations
from auditor.store.retention import Retention, prune
from auditor.store.tables import AggregateRow, AuditRunRow, BucketRow, JobRow, PodOwnerRow

NOW = datetime(2026, 11, 30, tzinfo=timezone.utc)
SPAN = timedelta(days=800)
PER_JOB = 50
W = timedelta(minutes=5)


def _at(i: int, n: int) -> datetime:
    return NOW - SPAN * (1 - i / n)


def fill(store: Store, runs: int, jobs: int, episodes: int) -> None:
    with store._engine.begin() as c:
        c.execute(
            sa.insert(AuditRunRow.__table__),
            [
                dict(
                    window_start=_at(i, runs) - W,
                    window_end=_at(i, runs),
                    started=_at(i, runs),
                    finished=_at(i, runs),
                    jobs=1,
                    queries=1,
                    status="ok",
                    detail={"origin": "operator", "cluster": "east" if i % 2 else "west"},
                )
                for i in range(runs)
            ],
        )
        c.execute(
            sa.insert(JobRow.__table__),
            [
                dict(
                    cluster="east",
                    namespace="ml",
                    kind="Job",
                    name=f"j{i}",
                    team="t",
                    first_seen=_at(i, jobs) - PER_JOB * W,
                    last_seen=_at(i, jobs),
                    ended_at=_at(i, jobs) if i % 3 else None,
                )
                for i in range(jobs)
            ],
        )
        ids = [r[0] for r in c.execute(sa.text("SELECT id FROM jobs ORDER BY id"))]
        c.execute(
            sa.insert(BucketRow.__table__),
            [
                dict(
                    job_id=jid,
                    pod_namespace="ml",
                    pod_name=f"p{jid}",
                    container="",
                    gpu_uuid="GPU-0",
                    gpu_instance="",
                    hostname="",
                    gpu_index="",
                    gpu_model="",
                    mig_profile="",
                    metric="sm_active",
                    start=_at(n, jobs) - W * (PER_JOB - k),
                    end=_at(n, jobs) - W * (PER_JOB - k - 1),
                    total=1.0,
                    count=4,
                    minimum=0.1,
                    maximum=0.3,
                    dropped=0,
                )
                for n, jid in enumerate(ids)
                for k in range(PER_JOB)
            ],
        )
        c.execute(
            sa.insert(PodOwnerRow.__table__),
            [
                dict(
                    cluster="east",
                    pod_namespace="ml",
                    pod_name=f"p{jid}",
                    job_id=jid,
                    first_start=_at(n, jobs) - W * PER_JOB,
                    last_start=_at(n, jobs) - W,
                )
                for n, jid in enumerate(ids)
            ],
        )
        c.execute(
            sa.insert(AggregateRow.__table__),
            [dict(job_id=jid, through=_at(n, jobs), updated=_at(n, jobs), state=b"{}") for n, jid in enumerate(ids)],
        )
        for i in range(episodes):
            at, closed = _at(i, episodes), bool(i % 4)
            vid = c.execute(
                sa.insert(violations).values(
                    cluster="east",
                    namespace="ml",
                    kind="Job",
                    name=f"j{i}",
                    policy="p",
                    episode=1,
                    state="closed" if closed else "open",
                    opened_at=at,
                    last_seen_at=at,
                    closed_at=at if closed else None,
                    next_step=1,
                    evidence={},
                )
            ).inserted_primary_key[0]
            did = c.execute(
                sa.insert(decisions).values(
                    dedup_key=f"d{i}",
                    violation_id=vid,
                    cluster="east",
                    namespace="ml",
                    kind="Job",
                    name=f"j{i}",
                    policy="p",
                    mode="enforce",
                    step=0,
                    actions=["annotate", "event"],
                    decided_at=at,
                    dry_run=False,
                    verdict="v",
                    reason="r",
                    evidence={},
                )
            ).inserted_primary_key[0]
            for a in ("annotate", "event"):
                c.execute(
                    sa.insert(actions).values(
                        dedup_key=f"d{i}#{a}",
                        decision_id=did,
                        cluster="east",
                        namespace="ml",
                        kind="Job",
                        name=f"j{i}",
                        policy="p",
                        action=a,
                        state="done" if i % 7 else "waiting",
                        attempts=1,
                        created_at=at,
                        updated_at=at,
                        result={},
                    )
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="an empty store: sqlite:///PATH or postgresql://...")
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--jobs", type=int, default=2_000)
    ap.add_argument("--episodes", type=int, default=10_000)
    args = ap.parse_args()
    store = Store.open(args.db)
    fill(store, args.runs, args.jobs, args.episodes)
    retention = Retention(buckets=timedelta(days=35), summaries=timedelta(days=400))
    print(f"{store.display_url}: {args.runs} runs, {args.jobs} jobs × {PER_JOB} buckets, {args.episodes} episodes\n")
    print("| step | seconds | rows (per table) |\n|---|---|---|")
    for label, now, dry in (
        ("dry run", NOW, True),
        ("prune", NOW, False),
        ("an hour later", NOW + timedelta(hours=1), False),
    ):
        t0 = time.perf_counter()
        result = prune(store, now, retention, cluster="east", dry_run=dry)
        rows = ", ".join(f"{t} {n}" for t, n in result.deleted.items() if n)
        print(f"| {label} | {time.perf_counter() - t0:.2f} | {rows or 'none'} |")
    store.close()


if __name__ == "__main__":
    main()
