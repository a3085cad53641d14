"""Benchmark: weekly report generation for a week of N job summaries, on SQLite and PostgreSQL.

What is measured, per database:

- **generate**: :func:`auditor.reports.generate` for every team at once (the cluster report:
  the week's ``GROUP BY``, the split of the jobs crossing the week's bounds through the bucket
  rollup, the top jobs per team with their findings, policy actions, and the four trend weeks);
- **render**: from that document, the cluster HTML page (three matplotlib charts), a one-team
  HTML page per team (charts included), the team CSV, the Markdown, the JSON, and the Slack
  messages of every team and the cluster;
- **jobs CSV**: streaming every job of the week (its in-week share) into the per-job CSV.

Peak memory: the process's resident set sampled every 5 ms during each step (peak, and growth
over the step's start), and its maximum resident set size (``ru_maxrss``) at the end.

Data: ``--jobs`` summaries in the measured week (real audit-JSON documents from the summary
code, ~3.5 kB each, varied per job) over ``--teams`` teams; 1 % of them cross the week's end and
have 5-minute buckets (GPU_UTIL, SM_ACTIVE, TENSOR_ACTIVE) so the rollup split is exercised;
plus ``--year-jobs`` summaries spread over the 52 weeks before it (the trend and the table
size a year of retention gives). Rows are bulk-loaded (COPY on PostgreSQL), not audited.

    .venv/bin/python bench/report_bench.py --pg postgresql://USER:PW@HOST:PORT/postgres \
        --jobs 100000 --year-jobs 1000000 --out bench/results/reports-$(date +%F).md
"""

from __future__ import annotations

import argparse
import copy
import gc
import io
import json
import platform
import random
import resource
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "reports"))

import sqlalchemy as sa  # noqa: E402

from auditor.reports import IsoWeek, Prices, ReportOptions, generate, iter_jobs, team_view  # noqa: E402
from auditor.reports.formats import teams_csv, to_json, to_markdown, write_jobs_csv  # noqa: E402
from auditor.reports.html import render_html  # noqa: E402
from auditor.reports.slack import cluster_message, team_message  # noqa: E402
from auditor.reports.weeks import zone  # noqa: E402
from auditor.store import Store  # noqa: E402
from auditor.store.store import summary_columns  # noqa: E402

UTC = timezone.utc
WEEK = IsoWeek(2026, 47)
PROFILES = ("healthy", "low_sm", "idle", "no_sm", "underutilized")


def templates() -> dict[str, dict]:
    """One real summary per activity profile (from the summary code, through a scratch store)."""
    from reportgen import GenJob, store_jobs

    ws = WEEK.bounds(zone("UTC"))[0]
    with Store.open("sqlite://") as s:
        return store_jobs(s, [GenJob("t", p, ws, 2, 1, p) for p in PROFILES], now=ws + timedelta(days=8))


def rows_for(
    n: int,
    start: datetime,
    span: timedelta,
    teams: int,
    first_id: int,
    rng: random.Random,
    tpl: dict[str, dict],
    cross: float = 0.0,
):
    """(job rows, summary rows, crossing job ids) for ``n`` jobs starting in ``[start, start+span)``."""
    we = start + span
    jobs, sums, crossing = [], [], []
    for k in range(n):
        jid = first_id + k
        prof = PROFILES[k % len(PROFILES)]
        team = f"team-{k % teams:02d}"
        is_cross = rng.random() < cross
        if is_cross:
            s = we - timedelta(minutes=5 * rng.randint(6, 72))
            hours = 12.0
        else:
            hours = rng.choice((0.5, 1, 2, 4, 8, 16))
            s = start + timedelta(seconds=rng.randint(0, int(span.total_seconds() - hours * 3600)))
        e = s + timedelta(hours=hours)
        gpus = rng.choice((1, 1, 2, 4, 8))
        doc = copy.copy(tpl[prof])
        gh = hours * gpus
        sm = doc.get("sm_active")
        waste = None if doc.get("waste_gpu_hours") is None else round(gh * (1 - (sm or 0)), 6)
        doc.update(
            job=f"Job/job-{jid}",
            namespace=f"ns-{team}",
            team=team,
            cluster="bench",
            uid=f"u{jid}",
            start=s.isoformat().replace("+00:00", "Z"),
            end=e.isoformat().replace("+00:00", "Z"),
            gpus=gpus,
            gpu_hours=gh,
            waste_gpu_hours=waste,
        )
        jobs.append(
            {
                "id": jid,
                "cluster": "bench",
                "namespace": f"ns-{team}",
                "kind": "Job",
                "name": f"job-{jid}",
                "uid": f"u{jid}",
                "team": team,
                "queue": None,
                "first_seen": s,
                "last_seen": e,
                "ended_at": e,
            }
        )
        sums.append(
            {
                "job_id": jid,
                "cluster": "bench",
                "namespace": f"ns-{team}",
                "team": team,
                "verdict": doc["verdict"],
                "start": s,
                "end": e,
                "gpu_hours": gh,
                "waste_gpu_hours": waste,
                "computed_at": e,
                "data": doc,
                **summary_columns(doc),
            }
        )  # what Store.save_summary writes beside the document
        if is_cross:
            crossing.append((jid, s, e, gpus, doc))
    return jobs, sums, crossing


def load(store: Store, jobs: list, sums: list, chunk: int = 20_000) -> None:
    from auditor.store.tables import JobRow, SummaryRow

    jt, st = JobRow.__table__, SummaryRow.__table__
    with store._engine.begin() as conn:
        for i in range(0, len(jobs), chunk):
            conn.execute(jt.insert(), jobs[i : i + chunk])
            conn.execute(st.insert(), sums[i : i + chunk])


def load_buckets(store: Store, crossing: list) -> int:
    from auditor.core.metrics import Metric
    from auditor.core.model import Bucket, GpuId, PodRef

    n = 0
    for jid, s, e, gpus, doc in crossing:
        pod = PodRef(doc["namespace"], doc["job"].split("/", 1)[1] + "-0", "main")
        out = []
        for g in range(gpus):
            gpu = GpuId(uuid=f"GPU-{jid}-{g}", hostname=f"n{jid}", index=str(g), model="NVIDIA H200")
            t = s
            while t < e:
                for m, v in (
                    (Metric.GPU_UTIL, doc.get("gpu_util") or 0.9),
                    (Metric.SM_ACTIVE, doc.get("sm_active")),
                    (Metric.TENSOR_ACTIVE, doc.get("tensor_active")),
                ):
                    if v is not None:
                        out.append(Bucket(pod, gpu, m, t, t + timedelta(minutes=5), v * 10, 10, v, v))
                t += timedelta(minutes=5)
        # the summary's busy sample count must match its buckets (the split's denominator)
        doc.setdefault("stats", {})
        doc["stats"] = {
            **doc["stats"],
            "gpu_util": {
                **doc["stats"].get("gpu_util", {}),
                "samples": 10 * len([b for b in out if b.metric is Metric.GPU_UTIL]),
            },
        }
        doc["busy_signal"] = "gpu_util"
        store.replace_buckets(jid, out)
        store.save_summary(jid, doc)
        n += len(out)
    return n


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def measure(label: str, fn: Callable[[], Any], results: dict) -> Any:
    """Wall time, and the peak resident memory during the step (sampled every 5 ms) above
    what the process held before it. (tracemalloc would count Python allocations exactly but
    slows matplotlib down several times, which would falsify the timing.)"""
    import threading

    gc.collect()
    base = _rss_mib()
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            peak[0] = max(peak[0], _rss_mib())

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0 = time.perf_counter()
    value = fn()
    dt = time.perf_counter() - t0
    stop.set()
    th.join()
    peak[0] = max(peak[0], _rss_mib())
    results[label] = {
        "seconds": round(dt, 3),
        "peak_rss_mib": round(peak[0], 1),
        "rss_growth_mib": round(peak[0] - base, 1),
    }
    print(f"  {label:<40} {dt:8.2f} s   peak RSS {peak[0]:7.1f} MiB (+{peak[0] - base:.1f})", flush=True)
    return value


def run_one(url: str, args: argparse.Namespace, tpl: dict[str, dict]) -> dict:
    results: dict[str, Any] = {}
    rng = random.Random(7)
    store = Store.open(url)
    ws, we = WEEK.bounds(zone("UTC"))
    if args.reuse:
        with store._engine.connect() as conn:
            have = conn.execute(sa.text("SELECT count(*) FROM job_summaries")).scalar_one()
        if have == args.jobs + args.year_jobs:
            print(f"  reusing the {have} summaries already loaded", flush=True)
            results["load_seconds"] = None
            return _measure_all(store, args, results, we)
    t0 = time.perf_counter()
    jobs, sums, crossing = rows_for(args.jobs, ws, we - ws, args.teams, 1, rng, tpl, cross=0.01)
    load(store, jobs, sums)
    del jobs, sums
    nb = load_buckets(store, crossing)
    first = 1 + args.jobs
    year_start = ws - timedelta(weeks=52)
    per_chunk = 100_000
    for i in range(0, args.year_jobs, per_chunk):
        n = min(per_chunk, args.year_jobs - i)
        j, s, _ = rows_for(n, year_start, ws - year_start - timedelta(hours=16), args.teams, first + i, rng, tpl)
        load(store, j, s)
    if store._engine.dialect.name == "postgresql":
        with store._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE"))
    else:
        with store._engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
    results["load_seconds"] = round(time.perf_counter() - t0, 1)
    results["crossing_jobs"] = len(crossing)
    results["bucket_rows"] = nb
    print(
        f"  loaded {args.jobs} + {args.year_jobs} summaries, {len(crossing)} crossing jobs, {nb} buckets in {results['load_seconds']} s",
        flush=True,
    )
    return _measure_all(store, args, results, we)


def _measure_all(store: Store, args: argparse.Namespace, results: dict, we: datetime) -> dict:
    opts = ReportOptions(prices=Prices({"NVIDIA H200": 3.5}, default=2.0), top_n=10)
    now = we + timedelta(hours=8)
    doc = measure("generate (all teams)", lambda: generate(store, WEEK, now=now, options=opts), results)
    assert doc["total"]["jobs"] == args.jobs, doc["total"]["jobs"]

    def weekly_outputs() -> int:
        """What the weekly run produces for every team: the cluster page (3 charts, every
        team's section), team CSV, Markdown, JSON, each team's Slack message and webhook body,
        and the admins' Slack message."""
        size = len(render_html(doc)) + len(teams_csv(doc)) + len(to_markdown(doc)) + len(to_json(doc))
        for t in doc["teams"]:
            size += len(json.dumps(team_message(doc, t)[1])) + len(to_json(team_view(doc, t["team"])))
        size += len(json.dumps(cluster_message(doc)[1]))
        return size

    measure(f"render weekly outputs ({len(doc['teams'])} teams)", weekly_outputs, results)
    measure(
        f"{len(doc['teams'])} one-team HTML pages (1 chart each)",
        lambda: [render_html(team_view(doc, t["team"])) for t in doc["teams"]],
        results,
    )
    measure(
        f"{len(doc['teams'])} one-team HTML pages, no charts",
        lambda: [render_html(team_view(doc, t["team"]), with_charts=False) for t in doc["teams"]],
        results,
    )

    def jobs_csv() -> int:
        buf = io.StringIO()
        return write_jobs_csv(buf, str(WEEK), iter_jobs(store, WEEK, options=opts))

    n = measure("per-job CSV (streamed)", jobs_csv, results)
    assert n == args.jobs
    rendered = results[f"render weekly outputs ({len(doc['teams'])} teams)"]["seconds"]
    results["weekly_reports_all_teams_s"] = round(results["generate (all teams)"]["seconds"] + rendered, 2)
    store.close()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--year-jobs", type=int, default=1_000_000)
    ap.add_argument("--teams", type=int, default=40)
    ap.add_argument("--pg", metavar="URL", help="PostgreSQL server URL (a database report_bench is created there)")
    ap.add_argument("--sqlite-dir", default="/tmp", help="where the SQLite file goes")
    ap.add_argument("--only", choices=("sqlite", "postgresql"))
    ap.add_argument(
        "--reuse", action="store_true", help="keep a database already holding the same numbers of rows (no reload)"
    )
    ap.add_argument("--out", metavar="FILE.md", help="append the results as Markdown")
    args = ap.parse_args()
    tpl = templates()
    out: dict[str, Any] = {
        "jobs": args.jobs,
        "year_jobs": args.year_jobs,
        "teams": args.teams,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} CPUs",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if args.only != "postgresql":
        db = Path(args.sqlite_dir) / "report_bench.sqlite"
        if not args.reuse:
            for p in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
                p.unlink(missing_ok=True)
        print("SQLite", db, flush=True)
        out["sqlite"] = run_one(f"sqlite:///{db}", args, tpl)
    if args.pg and args.only != "sqlite":
        import psycopg

        if not args.reuse:
            with psycopg.connect(args.pg, autocommit=True) as c:
                c.execute("DROP DATABASE IF EXISTS report_bench")
                c.execute("CREATE DATABASE report_bench")
        url = args.pg.rsplit("/", 1)[0] + "/report_bench"
        print("PostgreSQL", url.split("@")[-1], flush=True)
        out["postgresql"] = run_one(url, args, tpl)
    out["max_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write(f"\n## Run {out['date']}\n\n```json\n{json.dumps(out, indent=1)}\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
