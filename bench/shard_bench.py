"""Benchmark: the operator cycle over a generated 100,000-GPU history, as one process and as 4 shards.

``bench/tsdbgen`` writes the history (``--jobs`` jobs of one pod with ``--gpus`` GPUs, 9 DCGM
metrics at 30 s, spread over ``--namespaces`` namespaces) into a private Prometheus. Each
configuration runs in fresh processes, one per shard, one after the other (this machine has 2
cores), against one PostgreSQL store (a fresh database on the test bed's server): the first
sighting (the cycle that reads every job back to its start) and the steady-state cycle 5 minutes
later, each with its wall time, CPU time, peak RSS, queries and Prometheus's own CPU.

The job view is **simulated** (said in the results): 12,500 pods do not fit the shared test bed's
apiserver, so each shard gets the jobs of the generated names from a resolver built here, through
the same ShardResolver/ShardSource the operator uses. That sharding against the real apiserver,
Prometheus and PostgreSQL audits each job once, across a restart, is tests/operator/test_shards.py.

Usage: ``.venv/bin/python bench/shard_bench.py [--jobs 12500] [--shards 4] [--out bench/results]``
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
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import requests
from benchlib import REPO, PrivatePrometheus, log, query_requests, write_history

INTERVAL_S = 30
NAMESPACE = "team"


class SimResolver:
    """The job view of the generated history: job ``job-NNNNN`` of namespace ``team-MMM`` with
    one pod ``job-NNNNN-0`` (what tsdbgen names), every pod running since ``started``."""

    def __init__(self, jobs: int, namespaces: int, started: datetime, cluster: str) -> None:
        from auditor.core.identity import Quarantine
        from auditor.core.model import JobRef
        from auditor.kube.jobview import JobInfo, PodInfo

        self.cluster = cluster
        #: no owner is refused, and there is no Kueue (:class:`auditor.operator_loop.cycle.ClusterJobs`)
        self.rejected = Quarantine()
        self.workloads = None
        self.view: dict[str, Any] = {}
        self.refs: dict[tuple[str, str], Any] = {}
        for j in range(jobs):
            ns, name = f"{NAMESPACE}-{j % namespaces:03d}", f"job-{j:05d}"
            ref = JobRef(cluster=cluster, namespace=ns, kind="Job", name=name, uid=f"uid-{j}", team=ns)
            pod = PodInfo(
                ns, f"{name}-0", f"pod-{j}", {}, None, 8.0, "Running", f"node-{j:04d}-0", started, started, None
            )
            self.view[ref.key] = JobInfo(ref=ref, api_version="batch/v1", labels={}, pods=[pod])
            self.refs[(ns, f"{name}-0")] = ref

    def jobs(self, now: datetime | None = None) -> dict[str, Any]:
        return dict(self.view)

    def resolve(self, pods: Any) -> dict[Any, Any]:
        return {p: self.refs[(p.namespace, p.pod)] for p in pods if (p.namespace, p.pod) in self.refs}

    def forget(self, job: Any) -> None:
        pass


def prometheus_cpu(url: str) -> float:
    for line in requests.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("process_cpu_seconds_total "):
            return float(line.split()[1])
    return 0.0


def child(args: argparse.Namespace) -> None:
    """One shard's two cycles (first sighting, steady state), printed as JSON."""
    from auditor.core.shards import Shard
    from auditor.operator_loop.cycle import CycleRunner
    from auditor.operator_loop.shards import ShardResolver, ShardSource
    from auditor.sources.prometheus import PrometheusSource
    from auditor.store import Store

    end = datetime.fromtimestamp(args.end, timezone.utc)
    started = end - timedelta(minutes=args.minutes)
    shard = Shard(args.shard, args.total)
    resolver = ShardResolver(SimResolver(args.jobs, args.namespaces, started, "bench"), shard)
    source = ShardSource(PrometheusSource(args.prometheus, timeout=300), resolver)
    cycles = []
    with Store.open(args.db) as store:
        runner = CycleRunner(store=store, source=source, resolver=resolver, cluster="bench", shard=shard)
        for label, now in (("first sighting", end - timedelta(minutes=5)), ("steady state", end)):
            q0, p0 = query_requests(args.prometheus), prometheus_cpu(args.prometheus)
            c0, w0 = time.process_time(), time.perf_counter()
            result = runner.run(now=now)
            cycles.append(
                {
                    "cycle": label,
                    "wall_s": round(time.perf_counter() - w0, 2),
                    "cpu_s": round(time.process_time() - c0, 2),
                    "queries": query_requests(args.prometheus) - q0,
                    "prometheus_cpu_s": round(prometheus_cpu(args.prometheus) - p0, 2),
                    "jobs": len(result.summaries),
                    "jobs_in_view": result.jobs_seen,
                }
            )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"shard": shard.label, "cycles": cycles, "peak_rss_mb": round(peak)}))


def _database(admin_url: str, name: str, *, create: bool) -> str:
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"' if create else f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    parts = urlsplit(admin_url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def audited_once(db: str, jobs: int) -> dict[str, int]:
    """Jobs in the store and summaries per job: every generated job once, none twice."""
    import psycopg

    with psycopg.connect(db) as conn:
        n_jobs = conn.execute("SELECT count(*) FROM jobs WHERE cluster = 'bench'").fetchone()[0]
        dup = conn.execute(
            "SELECT count(*) FROM (SELECT namespace, name FROM jobs WHERE cluster = 'bench' "
            "GROUP BY namespace, name HAVING count(*) > 1) d"
        ).fetchone()[0]
    return {"generated": jobs, "in_store": int(n_jobs), "duplicated": int(dup)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prometheus", help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    ap.add_argument("--shard", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--total", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--end", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--jobs", type=int, default=12500, help="jobs of 8 GPUs (default 12,500 = 100,000 GPUs)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--namespaces", type=int, default=200)
    ap.add_argument("--minutes", type=int, default=15, help="history length, minutes (default 15)")
    ap.add_argument("--shards", default="1,4", help="configurations to run (default 1,4)")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "shard-bench")
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0

    from auditor.testbed import attach

    bed = attach()
    if bed is None:
        ap.error("the test bed is not running (its PostgreSQL holds the store): .venv/bin/python -m auditor.testbed up")
    work = Path(tempfile.mkdtemp(prefix="shard-bench-"))
    end = int(time.time()) // 300 * 300 - 600
    t0 = time.perf_counter()
    (work / "data").mkdir()
    write_history(
        work / "data",
        jobs=args.jobs,
        gpus=args.gpus,
        end=end,
        seconds=args.minutes * 60,
        interval=INTERVAL_S,
        namespace=NAMESPACE,
        namespaces=args.namespaces,
    )
    log(f"history written in {time.perf_counter() - t0:.0f} s")
    prom = PrivatePrometheus(work / "data")
    rows: list[dict] = []
    try:
        for total in [int(x) for x in args.shards.split(",")]:
            name = f"shardbench_{uuid.uuid4().hex[:8]}"
            db = _database(bed.postgres_admin_url, name, create=True)
            try:
                shards = []
                for i in range(total):
                    cmd = [sys.executable, __file__, "--child", "--prometheus", prom.url, "--db", db]
                    cmd += ["--shard", str(i), "--total", str(total), "--end", str(end), "--jobs", str(args.jobs)]
                    cmd += ["--namespaces", str(args.namespaces), "--minutes", str(args.minutes)]
                    env = {**os.environ, "PYTHONPATH": str(REPO)}
                    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
                    if out.returncode:
                        raise RuntimeError(f"shard {i}/{total} failed: {out.stderr[-3000:]}")
                    shards.append(json.loads(out.stdout.strip().splitlines()[-1]))
                    log(f"{total} shard(s), shard {i}: {shards[-1]}")
                rows.append({"total_shards": total, "shards": shards, "store": audited_once(db, args.jobs)})
            finally:
                _database(bed.postgres_admin_url, name, create=False)
    finally:
        prom.stop()
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    doc = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({os.cpu_count()} cores, Python {platform.python_version()})",
        "load_before": os.getloadavg(),
        "history": {
            "jobs": args.jobs,
            "gpus": args.jobs * args.gpus,
            "namespaces": args.namespaces,
            "minutes": args.minutes,
            "interval_s": INTERVAL_S,
            "metrics": 9,
        },
        "job_view": "simulated (the generated names), through ShardResolver/ShardSource",
        "store": "PostgreSQL (the test bed's), one database shared by the shards",
        "rows": rows,
    }
    (args.out / f"shard-{day}.json").write_text(json.dumps(doc, indent=2) + "\n")
    log(f"wrote {args.out / f'shard-{day}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
