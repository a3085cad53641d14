"""Benchmark: one audit of N jobs (8 GPUs each) against a real Prometheus, batched vs per-job.

Issue 3's targets: queries per audit independent of N; for the 5-minute window at N = 1,000 the
batched audit >= 10x faster than one query per job; for the 2 h window the auditor's own CPU
<= 25 % of the wall time; peak RSS <= 300 MB at N = 1,000.

History is written straight into a TSDB block by ``bench/tsdbgen`` (Prometheus's own TSDB package,
built from the Go module proxy and cached), then a private Prometheus (the same Debian binary and
flags as the test bed's) is started on it. Each measurement runs in a fresh subprocess so that
peak RSS and CPU time belong to that audit alone. Queries are counted by Prometheus itself
(``prometheus_http_requests_total`` for the query endpoints, before and after).

Usage: ``.venv/bin/python bench/audit_bench.py [--jobs 100,1000] [--out bench/results]``; ``--read``
measures issue 18's Prometheus read of an operator cycle alone (``--gpus 1000,10000``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, PrivatePrometheus, log, prometheus_cpu, write_history

GPUS = 8
INTERVAL_S = 30
HISTORY = timedelta(hours=2)
NAMES = (
    "DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_GR_ENGINE_ACTIVE|DCGM_FI_PROF_SM_ACTIVE|DCGM_FI_PROF_SM_OCCUPANCY|"
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE|DCGM_FI_PROF_DRAM_ACTIVE|DCGM_FI_DEV_POWER_USAGE|DCGM_FI_DEV_FB_USED|"
    "DCGM_FI_DEV_SM_CLOCK"
)


def measure(
    mode: str, url: str, namespace: str, jobs: int, start: float, end: float, code_dir: str | None = None
) -> dict:
    """Run one audit in a fresh interpreter (the product from ``code_dir`` when given) and
    return its own wall, CPU and peak RSS."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, url, namespace, str(jobs), str(start), str(end)],
        capture_output=True,
        text=True,
        env=_code_env(code_dir),
    )
    if out.returncode != 0:
        raise RuntimeError(f"{mode} audit failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def child(mode: str, url: str, namespace: str, jobs: int, start: float, end: float) -> None:
    """The measured side: a batched audit through the product, or one query per job."""
    window_start = datetime.fromtimestamp(start, timezone.utc)
    window_end = datetime.fromtimestamp(end, timezone.utc)
    t0, c0 = time.perf_counter(), time.process_time()
    if mode == "batched":
        from auditor.core.model import Window
        from auditor.correlate import NoKubeResolver
        from auditor.engine import run_audit
        from auditor.sources.prometheus import PrometheusSource

        result = run_audit(
            PrometheusSource(url),
            NoKubeResolver(),
            None,
            Window(window_start, window_end),
            now=window_end,
        )
        found = len([s for s in result.summaries if s.namespace == namespace])
    else:
        # One query per job for all its metrics, as per-job tools do: the job's raw samples over
        # the window, reduced client-side to the same sum/count/min/max the batched audit keeps.
        session = requests.Session()
        rng = f"{int(end - start)}s"
        found = 0
        for j in range(jobs):
            pod = f"job-{j:05d}-0"
            query = f'{{__name__=~"{NAMES}", namespace="{namespace}", pod="{pod}"}}[{rng}]'
            r = session.get(f"{url}/api/v1/query", params={"query": query, "time": end}, timeout=60)
            r.raise_for_status()
            stats = {}
            for series in r.json()["data"]["result"]:
                values = [float(v) for _, v in series["values"]]
                key = (series["metric"]["__name__"], series["metric"].get("UUID"))
                stats[key] = (sum(values), len(values), min(values), max(values))
            found += bool(stats)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak_kb / 1024, "jobs_found": found}))


def load_child(url: str, db: str, start: float, end: float) -> None:
    """``gpu-auditor audit --no-kube --db URL`` over the window, its own wall, CPU and peak RSS."""
    import contextlib
    import io

    from auditor.cli.main import main as cli

    def iso(t: float) -> str:
        return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    t0, c0 = time.perf_counter(), time.process_time()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli(["audit", "--prometheus", url, "--no-kube", "--start", iso(start), "--end", iso(end), "--db", db])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak_kb / 1024, "rc": rc}))


def read_child(url: str, start: float, end: float, reads: int) -> None:
    """Issue 18's read alone: ``PrometheusSource.read_lazy`` of one window, as an operator's
    long-lived source does it each cycle (one read first, which learns the server's version
    and scrape interval), then ``reads`` reads measured one by one (the engine reads with the
    collector paused, so they are too)."""
    import gc

    from auditor.core.model import Window
    from auditor.sources.prometheus import PrometheusSource

    window = Window(datetime.fromtimestamp(start, timezone.utc), datetime.fromtimestamp(end, timezone.utc))
    width = timedelta(minutes=5)
    src = PrometheusSource(url)
    gc.disable()
    first = src.read_lazy(window, width)
    rows = []
    for _ in range(reads):
        prom0 = prometheus_cpu(url)
        t0, c0 = time.perf_counter(), time.process_time()
        res = src.read_lazy(window, width)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append(
            {
                "wall_s": wall,
                "cpu_s": cpu,
                "prometheus_cpu_s": prometheus_cpu(url) - prom0,
                "queries": res.report.queries,
                "buckets": len(res.buckets),
                "pieces": len(res.buckets.pieces),
            }
        )
        del res
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"reads": rows, "first_queries": first.report.queries, "peak_rss_mb": peak_kb / 1024}))


def read_figure(args: argparse.Namespace) -> int:
    """Issue 18's read: the 5-minute window of every GPU, before and after in one run (the
    codes alternate, each read in a fresh process on the same Prometheus), with Prometheus's
    own CPU for the same read beside ours."""
    codes: list[tuple[str, str | None]] = [("before", args.baseline)] if args.baseline else []
    codes.append(("after" if args.baseline else "current", args.after))
    rows = []
    for gpus in [int(x) for x in args.gpus.split(",")]:
        work = Path(tempfile.mkdtemp(prefix=f"gpa-bench-read-{gpus}-"))
        (work / "data").mkdir()
        end = int(time.time()) // 300 * 300 - 300
        log(f"read: writing {gpus} GPUs x 1 h at {args.interval} s")
        write_history(
            work / "data",
            jobs=gpus // GPUS,
            gpus=GPUS,
            end=end,
            seconds=3600,
            interval=args.interval,
            namespace="bench",
        )
        prom = PrivatePrometheus(work / "data")
        try:
            for rep in range(args.repeat):
                for code, code_dir in codes:
                    env = _code_env(code_dir)
                    load = os.getloadavg()[0]
                    out = subprocess.run(
                        [sys.executable, __file__, "--read-child", prom.url, str(end - 300), str(end), str(args.reads)],
                        capture_output=True,
                        text=True,
                        env=env,
                    )
                    if out.returncode != 0:
                        raise RuntimeError(f"read failed:\n{out.stderr[-3000:]}")
                    res = json.loads(out.stdout.strip().splitlines()[-1])
                    for i, r in enumerate(res["reads"]):
                        r.update(
                            {
                                "gpus": gpus,
                                "interval_s": args.interval,
                                "code": code,
                                "repeat": rep,
                                "read": i,
                                "peak_rss_mb": res["peak_rss_mb"],
                                "load": [round(load, 2), round(os.getloadavg()[0], 2)],
                            }
                        )
                        rows.append(r)
                    log(f"read {gpus} GPUs {code}: {res}")
        finally:
            prom.stop()
            shutil.rmtree(work, ignore_errors=True)
    day = _day(args)
    _write(
        Path(args.out),
        f"read-{day}",
        rows,
        [
            f"# The Prometheus read of an operator cycle (issue 18), {day}",
            "",
            "Machine: {machine}. `PrometheusSource.read_lazy` of a 5-minute window (one 5-minute bucket) "
            f"of every GPU: {GPUS} GPUs per pod, 9 DCGM metrics at {args.interval} s, in a fresh process "
            "per code after one unmeasured read (an operator's source is long-lived); the collector "
            "paused as the engine pauses it. Prometheus CPU: its own process_cpu_seconds_total around "
            "the read. Load: the 1-minute load average before / after the process.",
            "",
            "| GPUs | code | read | queries | auditor CPU s | CPU ms per GPU | wall s | Prometheus CPU s | load |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---|",
        ],
        lambda r: (
            f"| {r['gpus']:,} | {r['code']} | {r['repeat']}.{r['read']} | {r['queries']} | {r['cpu_s']:.2f} | "
            f"{1000 * r['cpu_s'] / r['gpus']:.3f} | {r['wall_s']:.2f} | {r['prometheus_cpu_s']:.2f} | "
            f"{' / '.join(str(x) for x in r['load'])} |"
        ),
    )
    return 0


def load_figure(args: argparse.Namespace) -> int:
    """Issue 20's load figure: 2,000 pods x 2 GPUs x 6 h at 30 s, ``audit`` into each store."""
    from auditor.testbed import attach

    bed = attach()
    if bed is None and "postgresql" in args.store:
        raise SystemExit("--store postgresql needs the running test bed")
    codes: list[tuple[str, str | None]] = [("before", args.baseline)] if args.baseline else []
    codes.append(("after" if args.baseline else "current", args.after))
    work = Path(tempfile.mkdtemp(prefix="gpa-bench-load-"))
    (work / "data").mkdir()
    end = int(time.time()) // 300 * 300 - 300
    seconds = 6 * 3600
    log("load figure: writing 2000 pods x 2 GPUs x 6 h at 30 s")
    write_history(work / "data", jobs=2000, gpus=2, end=end, seconds=seconds, interval=30, namespace="load")
    prom = PrivatePrometheus(work / "data")
    rows = []
    try:
        for rep in range(args.repeat):
            for code, code_dir in codes:
                for store in args.store.split(","):
                    name = f"loadbench_{os.getpid()}_{len(rows)}"
                    db = f"sqlite:///{work / (name + '.db')}" if store == "sqlite" else _database(bed, name, True)
                    env = _code_env(code_dir)
                    load = os.getloadavg()[0]
                    try:
                        out = subprocess.run(
                            [sys.executable, __file__, "--load-child", prom.url, db, str(end - seconds), str(end)],
                            capture_output=True,
                            text=True,
                            env=env,
                            cwd=work,
                        )
                    finally:
                        if store == "postgresql":
                            _database(bed, name, False)
                    if out.returncode != 0:
                        raise RuntimeError(f"audit failed:\n{out.stderr[-3000:]}")
                    res = json.loads(out.stdout.strip().splitlines()[-1])
                    res.update(
                        {
                            "code": code,
                            "store": store,
                            "repeat": rep,
                            "load": [round(load, 2), round(os.getloadavg()[0], 2)],
                        }
                    )
                    log(f"load figure {code} {store}: {res}")
                    rows.append(res)
    finally:
        prom.stop()
        shutil.rmtree(work, ignore_errors=True)
    day = _day(args)
    _write(
        Path(args.out),
        f"audit-load-{day}",
        rows,
        [
            f"# Audit load figure (issue 20), {day}",
            "",
            "Machine: {machine}. 2,000 pods x 2 GPUs x 6 h at 30 s, 9 DCGM metrics; `gpu-auditor audit --no-kube "
            "--db URL` over the 6 h in a fresh process (SQLite file; a fresh database in the test bed's PostgreSQL "
            "15). Load: the 1-minute load average before / after.",
            "",
            "| code | store | wall s | CPU s | peak RSS MB | load |",
            "|---|---|---:|---:|---:|---|",
        ],
        lambda r: (
            f"| {r['code']} | {r['store']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['peak_rss_mb']:.0f} | "
            f"{' / '.join(str(x) for x in r['load'])} |"
        ),
    )
    return 0


def _code_env(code_dir: str | None) -> dict[str, str]:
    """The environment of a measured child: the product at ``code_dir`` first on the path."""
    env = dict(os.environ)
    if code_dir:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [code_dir, env.get("PYTHONPATH")]))
    return env


def _day(args: argparse.Namespace) -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d") + (f"-{args.tag}" if args.tag else "")


def _database(bed, name: str, create: bool) -> str:
    """Create (or drop) a database beside the test bed's maintenance one; its URL."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    with psycopg.connect(bed.postgres_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"' if create else f'DROP DATABASE IF EXISTS "{name}"')
    parts = urlsplit(bed.postgres_admin_url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        mode, url, ns, jobs, start, end = sys.argv[2:8]
        child(mode, url, ns, int(jobs), float(start), float(end))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--read-child":
        url, start, end, reads = sys.argv[2:6]
        read_child(url, float(start), float(end), int(reads))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--load-child":
        url, db, start, end = sys.argv[2:6]
        load_child(url, db, float(start), float(end))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="100,1000", help="comma-separated job counts")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"), help="where to write results")
    ap.add_argument(
        "--load-figure",
        action="store_true",
        help="issue 20's figure instead: 2,000 pods x 2 GPUs x 6 h at 30 s, `audit` into each --store",
    )
    ap.add_argument(
        "--read",
        action="store_true",
        help="issue 18's read instead: read_lazy of every GPU's 5-minute window (--gpus), Prometheus CPU beside",
    )
    ap.add_argument("--gpus", default="1000,10000", help="with --read: comma-separated GPU counts")
    ap.add_argument("--interval", type=int, default=30, help="with --read: the scrape interval of the history, s")
    ap.add_argument("--reads", type=int, default=3, help="with --read: measured reads per process")
    ap.add_argument("--store", default="sqlite,postgresql", help="with --load-figure: sqlite, postgresql or both")
    ap.add_argument("--baseline", metavar="DIR", help="also the product at DIR, before (batched audit, read, load)")
    ap.add_argument(
        "--after", metavar="DIR", help="with --load-figure/--read: the product measured as 'after' from DIR"
    )
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--windows", default="5m,2h", help="comma-separated, of 5m, 2h")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    if args.load_figure:
        return load_figure(args)
    if args.read:
        return read_figure(args)
    rows = []
    for n in [int(x) for x in args.jobs.split(",")]:
        work = Path(tempfile.mkdtemp(prefix=f"gpa-bench-{n}-"))
        data = work / "data"
        data.mkdir()
        end = int(time.time()) // 300 * 300 - 300  # aligned, safely in the past
        log(f"N={n}: writing {n * GPUS} GPUs x {HISTORY} at {INTERVAL_S}s into a TSDB block")
        t = time.perf_counter()
        write_history(
            data,
            jobs=n,
            gpus=GPUS,
            end=end,
            seconds=int(HISTORY.total_seconds()),
            interval=INTERVAL_S,
            namespace="bench",
        )
        log(f"N={n}: block written in {time.perf_counter() - t:.1f} s; starting Prometheus")
        prom = PrivatePrometheus(data)
        try:
            windows = {"5m": 300, "2h": int(HISTORY.total_seconds())}
            for label, seconds in ((w, windows[w]) for w in args.windows.split(",")):
                start = end - seconds
                runs = [("batched, before", args.baseline)] if args.baseline else []
                runs += [("batched", args.after), ("per-job", None)]
                for mode, code_dir in runs * args.repeat:
                    before, cpu0 = prom.query_requests(), prometheus_cpu(prom.url)
                    load = os.getloadavg()[0]
                    res = measure(mode.split(",")[0], prom.url, "bench", n, start, end, code_dir)
                    res["queries"] = prom.query_requests() - before
                    res["prometheus_cpu_s"] = prometheus_cpu(prom.url) - cpu0
                    res["load"] = [round(load, 2), round(os.getloadavg()[0], 2)]
                    res.update({"jobs": n, "window": label, "mode": mode})
                    log(f"N={n} window={label} {mode}: {res}")
                    rows.append(res)
        finally:
            prom.stop()
            shutil.rmtree(work, ignore_errors=True)
    write_results(Path(args.out), rows, _day(args))
    return 0


def write_results(out: Path, rows: list[dict], day: str) -> None:
    _write(
        out,
        f"audit-{day}",
        rows,
        [
            f"# Audit benchmark, {day}",
            "",
            f"Machine: {{machine}}. History: {GPUS} GPUs per job, {HISTORY} at {INTERVAL_S} s, 9 DCGM metrics.",
            "",
            "| jobs | window | mode | queries | wall s | auditor CPU s | CPU/wall | Prometheus CPU s | peak RSS MB | load |",
            "|---:|---|---|---:|---:|---:|---:|---:|---:|---|",
        ],
        lambda r: (
            f"| {r['jobs']} | {r['window']} | {r['mode']} | {r['queries']} | {r['wall_s']:.2f} | "
            f"{r['cpu_s']:.2f} | {r['cpu_s'] / r['wall_s']:.0%} | {r.get('prometheus_cpu_s', 0):.2f} | "
            f"{r['peak_rss_mb']:.0f} | {' / '.join(str(x) for x in r.get('load', []))} |"
        ),
    )


def _write(out: Path, stem: str, rows: list[dict], head: list[str], row_line) -> None:
    """``STEM.json`` (the rows, the machine) and ``STEM.md`` (``head`` with ``{machine}``, a line per row)."""
    out.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.node()} ({os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()})"
    (out / f"{stem}.json").write_text(json.dumps({"name": stem, "machine": machine, "rows": rows}, indent=2))
    lines = [h.replace("{machine}", machine) for h in head] + [row_line(r) for r in rows]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
