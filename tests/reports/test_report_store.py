"""Report aggregation over the real store, on SQLite and PostgreSQL: week splits, DST weeks,
empty teams, unmeasured hours, policy actions, per-job rows equal to the totals, the schema."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from reportgen import GenJob, store_jobs

from auditor.reports import IsoWeek, Prices, ReportOptions, generate, iter_jobs
from auditor.reports.formats import teams_csv, write_jobs_csv
from auditor.reports.weeks import zone
from auditor.store import Store
from auditor.store.reports import ReportStore, deliveries

UTC = timezone.utc
W = IsoWeek(2026, 47)
WS, WE = W.bounds(zone("UTC"))
NOW = WE + timedelta(hours=8)
PRICES = Prices({"NVIDIA H200": 4.0}, default=2.0)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.testbed)])
def store(request: pytest.FixtureRequest, tmp_path):
    url = f"sqlite:///{tmp_path}/store.db" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    s = Store.open(url)
    yield s
    s.close()


def by_team(doc: dict) -> dict[str, dict]:
    return {t["team"]: t for t in doc["teams"]}


def test_week_totals_split_and_unmeasured(store: Store) -> None:
    s = store_jobs(
        store,
        [
            GenJob("a", "healthy", WS + timedelta(hours=10), 6, 2, "healthy"),
            GenJob("a", "spin", WS + timedelta(days=1), 4, 1, "low_sm"),
            GenJob("a", "nosm", WS + timedelta(days=2), 2, 1, "no_sm", model="NVIDIA A100"),
            # 4 h before the end of the week, 8 h after: split 1/3 : 2/3 by the rollup
            GenJob("b", "cross", WE - timedelta(hours=4), 12, 1, "low_sm"),
            # started the week before
            GenJob("b", "early", WS - timedelta(hours=2), 4, 2, "healthy"),
        ],
        now=NOW,
    )
    assert s["cross"]["verdict"] == "low_sm_efficiency" and s["nosm"]["waste_gpu_hours"] is None
    doc = generate(store, W, now=NOW, options=ReportOptions(prices=PRICES))
    a, b = by_team(doc)["a"], by_team(doc)["b"]
    assert a["jobs"] == 3 and a["gpu_hours"] == 12 + 4 + 2
    assert a["unmeasured_gpu_hours"] == 2.0 and a["measured_gpu_hours"] == 16.0
    # waste: the flagged job's idle SMs; the healthy one's are headroom (docs/figures.md)
    assert a["waste_gpu_hours"] == pytest.approx(4 * 0.96, abs=1e-3)
    assert a["headroom_gpu_hours"] == pytest.approx(12 * 0.18, abs=1e-3)
    assert a["sm_active_gpu_hours"] == pytest.approx(12 * 0.82 + 4 * 0.04, abs=1e-3)
    assert a["efficiency"] == pytest.approx((12 * 0.82 + 4 * 0.04) / 16, abs=1e-4)
    assert a["tensor_active_gpu_hours"] == pytest.approx(12 * 0.45, abs=1e-3)
    # cost: H200 at 4, the A100 job at the default 2
    assert a["cost"] == pytest.approx(16 * 4 + 2 * 2, abs=0.01)
    assert a["waste_cost"] == pytest.approx(a["waste_gpu_hours"] * 4, abs=0.01)
    assert a["verdicts"]["insufficient_data"] == 1 and a["verdicts"]["healthy"] == 1
    # b: 4 of the cross job's 12 GPU-hours, 4 of early's 8 (2 of its 4 h on 2 GPUs were the week before)
    assert b["gpu_hours"] == pytest.approx(4 + 4, abs=1e-3)
    splits = {j["job"]: j for j in iter_jobs(store, W)}
    assert splits["Job/cross"]["split"] == "rollup" and splits["Job/cross"]["week_fraction"] == pytest.approx(
        1 / 3, abs=1e-4
    )
    assert splits["Job/early"]["week_fraction"] == 0.5
    assert splits["Job/healthy"]["split"] == "inside"
    # the next and the previous week get the rest: nothing counted twice, nothing lost
    nxt = by_team(generate(store, W.shift(1), now=NOW, options=ReportOptions(prices=PRICES)))["b"]
    prev = by_team(generate(store, W.shift(-1), now=NOW, options=ReportOptions(prices=PRICES)))["b"]
    assert nxt["gpu_hours"] + b["gpu_hours"] + prev["gpu_hours"] == pytest.approx(12 + 8, abs=1e-3)
    assert nxt["gpu_hours"] == pytest.approx(8, abs=1e-3) and prev["gpu_hours"] == pytest.approx(4, abs=1e-3)
    # the trend of the next week shows this week
    nxt_doc = generate(store, W.shift(1), now=NOW)
    assert [p["week"] for p in nxt_doc["total"]["trend"]] == [
        "2026-W44",
        "2026-W45",
        "2026-W46",
        "2026-W47",
        "2026-W48",
    ]
    assert nxt_doc["total"]["trend"][3]["gpu_hours"] == doc["total"]["gpu_hours"]
    # a: no jobs next week but seen within the trend: an honest empty entry
    empty = by_team(nxt_doc)["a"]
    assert empty["jobs"] == 0 and empty["efficiency"] is None and empty["top_jobs"] == [] and "No jobs" in empty["note"]
    # top jobs: most in-week waste first, with verdict and advice
    top = doc["total"]["top_jobs"]
    assert [j["job"] for j in top][:2] == ["Job/spin", "Job/cross"]
    assert top[0]["verdict"] == "low_sm_efficiency" and "thread" in top[0]["advice"]
    assert all(j["waste_gpu_hours"] is not None for j in top)


def test_time_split_when_the_rollup_is_gone(store: Store) -> None:
    store_jobs(store, [GenJob("c", "long", WE - timedelta(hours=6), 24, 1, "low_sm")], now=NOW)
    # retention removed the buckets: the split falls back to the summary's span
    store.apply_retention(
        NOW + timedelta(days=400), bucket_retention=timedelta(days=1), summary_retention=timedelta(days=10_000)
    )
    (row,) = list(iter_jobs(store, W))
    assert row["split"] == "time" and row["week_fraction"] == 0.25 and row["gpu_hours"] == 6.0
    assert row["waste_gpu_hours"] == pytest.approx(24 * 0.96 / 4, abs=1e-3)


def test_dst_week_split_in_berlin(store: Store) -> None:
    tz = "Europe/Berlin"
    week = IsoWeek(2026, 43)  # Sunday 2026-10-25 03:00 CEST → 02:00 CET: 169 hours
    ws, we = week.bounds(zone(tz))
    assert we - ws == timedelta(hours=169)
    # a job from Sunday 20:00 UTC to Monday 02:00 UTC: 3 h before the Berlin week ends (23:00 UTC), 3 h after
    store_jobs(
        store, [GenJob("d", "dst", datetime(2026, 10, 25, 20, tzinfo=UTC), 6, 1, "healthy")], now=we + timedelta(days=1)
    )
    doc = generate(store, week, now=we + timedelta(days=1), options=ReportOptions(timezone=tz))
    assert (
        doc["hours_in_week"] == 169.0
        and doc["start"] == "2026-10-18T22:00:00Z"
        and doc["end"] == "2026-10-25T23:00:00Z"
    )
    assert by_team(doc)["d"]["gpu_hours"] == pytest.approx(3.0, abs=1e-3)
    nxt = generate(store, week.shift(1), now=we + timedelta(days=1), options=ReportOptions(timezone=tz))
    assert by_team(nxt)["d"]["gpu_hours"] == pytest.approx(3.0, abs=1e-3)
    # the same job in UTC weeks is entirely inside W43 (ends Monday 02:00 UTC, week ends Monday 00:00 UTC → split 4:2)
    utc_doc = generate(store, week, now=we + timedelta(days=1))
    assert by_team(utc_doc)["d"]["gpu_hours"] == pytest.approx(4.0, abs=1e-3)


def test_named_team_without_jobs_gets_an_empty_report(store: Store) -> None:
    doc = generate(store, W, now=NOW, team="nobody")
    t = doc["total"]
    assert doc["scope"] == "team" and t["team"] == "nobody"
    assert t["jobs"] == 0 and t["gpu_hours"] == 0.0 and t["efficiency"] is None and t["note"]
    assert [(p["jobs"], p["gpu_hours"]) for p in t["trend"]] == [(0, None)] * 5  # no data, never 0
    # a configured team appears in the cluster report even without any job
    doc = generate(store, W, now=NOW, options=ReportOptions(teams=("quiet",)))
    assert [x["team"] for x in doc["teams"]] == ["quiet"] and doc["total"]["jobs"] == 0


def test_per_job_rows_add_up_to_the_totals(store: Store) -> None:
    jobs = [
        GenJob(
            f"t{k % 3}",
            f"j{k}",
            WS + timedelta(hours=7 * k - 5),
            1 + k % 9,
            1 + k % 4,
            ("healthy", "low_sm", "idle", "no_sm", "underutilized")[k % 5],
        )
        for k in range(24)
    ]
    store_jobs(store, jobs, now=NOW)
    doc = generate(store, W, now=NOW, options=ReportOptions(prices=PRICES))
    buf = io.StringIO()
    n = write_jobs_csv(buf, str(W), iter_jobs(store, W, options=ReportOptions(prices=PRICES)))
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert n == len(rows) == doc["total"]["jobs"]
    total = doc["total"]
    assert sum(float(r["gpu_hours"] or 0) for r in rows) == pytest.approx(total["gpu_hours"], abs=1e-3 * len(rows))
    # the per-job rows keep every job's idle-SM hours; summed, waste is the flagged jobs' and
    # headroom the healthy ones' (docs/figures.md)
    for key, flagged in (("waste_gpu_hours", True), ("headroom_gpu_hours", False)):
        part = [
            r for r in rows if r["verdict"] not in ("insufficient_data",) and (r["verdict"] != "healthy") == flagged
        ]
        assert sum(float(r["waste_gpu_hours"] or 0) for r in part) == pytest.approx(total[key], abs=1e-3 * len(rows))
    assert sum(float(r["gpu_hours"]) for r in rows if r["waste_gpu_hours"] == "") == pytest.approx(
        total["unmeasured_gpu_hours"], abs=0.01
    )
    teams = list(csv.DictReader(io.StringIO(teams_csv(doc))))
    assert teams[-1]["row"] == "total"
    for key in ("jobs", "gpu_hours", "waste_gpu_hours", "unmeasured_gpu_hours", "cost", "waste_cost"):
        assert float(teams[-1][key]) == total[key]
        assert sum(float(r[key]) for r in teams[:-1]) == pytest.approx(total[key], abs=0.01)


def test_policy_actions_are_counted_per_team(store: Store) -> None:
    store_jobs(store, [GenJob("e", "acted", WS + timedelta(days=1), 3, 1, "low_sm")], now=NOW)
    with store._engine.begin() as conn:
        assert sa.inspect(conn).has_table("policy_actions")
        a = sa.Table("policy_actions", sa.MetaData(), autoload_with=conn)
        base = dict(cluster="c1", namespace="ns-e", kind="Job", name="acted", policy="p", attempts=1, result={})
        rows = [
            dict(base, dedup_key="k1", action="annotate", state="done", created_at=WS + timedelta(days=1, hours=2)),
            dict(base, dedup_key="k2", action="slack", state="done", created_at=WS + timedelta(days=1, hours=3)),
            dict(base, dedup_key="k3", action="slack", state="failed", created_at=WS + timedelta(days=1, hours=3)),
            dict(base, dedup_key="k4", action="annotate", state="done", created_at=WE + timedelta(hours=1)),
        ]
        conn.execute(a.insert(), [dict(r, updated_at=r["created_at"]) for r in rows])
    t = by_team(generate(store, W, now=NOW))["e"]
    assert t["actions"] == {"annotate": 1, "slack": 1} and t["actions_total"] == 2


def test_ledger_table_matches_migration(store: Store) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    ours = sa.MetaData()
    deliveries.to_metadata(ours)
    with store._engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"compare_type": True, "include_object": lambda o, n, t, r, c: t != "table" or n in ours.tables}
        )
        assert compare_metadata(ctx, ours) == []


def test_claims_are_exclusive(store: Store) -> None:
    rs = ReportStore(store)
    kw = dict(
        cluster="c", week="2026-W47", team="a", channel="slack", claim_timeout=timedelta(minutes=15), max_attempts=3
    )
    t0 = NOW
    assert rs.claim(dedup_key="k", now=t0, holder="one", **kw)
    assert not rs.claim(dedup_key="k", now=t0 + timedelta(minutes=1), holder="two", **kw)
    # the holder died: after the timeout another takes over
    assert rs.claim(dedup_key="k", now=t0 + timedelta(minutes=16), holder="two", **kw)
    rs.finish("k", ok=False, now=t0, holder="one", error="late", detail={})  # not the holder any more: ignored
    assert rs.deliveries()[0]["status"] == "claimed"
    rs.finish("k", ok=False, now=t0, holder="two", error="HTTP 500", detail={})
    assert rs.claim(dedup_key="k", now=t0 + timedelta(minutes=17), holder="three", **kw)  # failed: retried
    rs.finish("k", ok=True, now=t0, holder="three", error=None, detail={"status": 200})
    assert not rs.claim(dedup_key="k", now=t0 + timedelta(days=1), holder="four", **kw)  # sent: final
    (row,) = rs.deliveries()
    assert row["status"] == "sent" and row["attempts"] == 3 and row["claimed_by"] == "three"
