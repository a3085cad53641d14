"""Benchmark: operator cycles with 2,000 GPU pods (200 jobs x 10 pods x 1 GPU) in a real apiserver.

Issue 4: one cycle's wall time, Kubernetes API requests, Prometheus queries and peak RSS; and
the cycle time when the jobs are 1 h old versus 24 h old (history at 60 s). Target: the
steady-state cycle costs the same whatever the jobs' age, because a cycle reads only the samples
since the previous one (the first sighting of a job reads it from its start, and is reported too).

Objects go into the test bed's apiserver (reused when running, else a private one is started);
the history is written by ``bench/tsdbgen`` into a private Prometheus, so the shared test bed's
TSDB is not touched. Each age runs the operator in a fresh subprocess, so its peak RSS is its own.

Usage: ``.venv/bin/python bench/operator_bench.py [--jobs 200] [--pods 10] [--out bench/results]``
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
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, PrivatePrometheus, log, prometheus_cpu, query_requests, write_history

INTERVAL_S = 60
AGES = {"1h": 3600, "24h": 86400, "7d": 7 * 86400}


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def create_jobs(api, namespace: str, jobs: int, pods: int, started: datetime) -> float:
    """200 batch Jobs with their pods, bound to nodes and Running, as their controllers would leave them."""
    from auditor.kube.client import call_json, resource_path

    def post(api_version: str, plural: str, body: dict, ns: str | None = namespace) -> dict:
        return call_json(api, resource_path(api_version, plural, ns), method="POST", body=body)

    t0 = time.perf_counter()
    post("v1", "namespaces", {"metadata": {"name": namespace, "labels": {"team": "bench"}}}, ns=None)
    container = {"name": "main", "image": "example.invalid/train:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}

    def one_job(j: int) -> None:
        name = f"job-{j:05d}"
        job = post(
            "batch/v1",
            "jobs",
            {
                "metadata": {"name": name},
                "spec": {
                    "suspend": True,
                    "completions": pods,
                    "parallelism": pods,
                    "template": {
                        "metadata": {"labels": {"app": "bench"}},
                        "spec": {"restartPolicy": "Never", "containers": [container]},
                    },
                },
            },
        )
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": name,
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        for p in range(pods):
            pod = f"{name}-{p}"
            post(
                "v1",
                "pods",
                {
                    "metadata": {"name": pod, "ownerReferences": [owner], "labels": {"app": "bench"}},
                    "spec": {"restartPolicy": "Never", "nodeName": f"node-{j:04d}-{p}", "containers": [container]},
                },
            )
            call_json(
                api,
                resource_path("v1", "pods", namespace, pod) + "/status",
                method="PATCH",
                body={
                    "status": {
                        "phase": "Running",
                        "startTime": _iso(started),
                        "containerStatuses": [
                            {
                                "name": "main",
                                "image": container["image"],
                                "imageID": "",
                                "ready": True,
                                "restartCount": 0,
                                "state": {"running": {"startedAt": _iso(started)}},
                            }
                        ],
                    }
                },
                content_type="application/merge-patch+json",
            )

    # a few jobs at a time: 10,000 pods are 20,000 requests
    with ThreadPoolExecutor(max_workers=6) as pool:
        for done, _ in enumerate(pool.map(one_job, range(jobs)), 1):
            if done % 100 == 0:
                log(f"  {done}/{jobs} jobs created")
    return time.perf_counter() - t0


def child(settings_path: str, t_end: float) -> None:
    """The measured side: one operator, two cycles (first sighting, then steady state 5 min later)."""
    from auditor.operator_loop.service import Operator
    from auditor.settings import load_settings

    settings = load_settings(settings_path)
    op = Operator(settings)
    url = settings.prometheus.url
    t0 = time.perf_counter()
    op.start(http=False)
    sync = {"seconds": time.perf_counter() - t0, "kube_requests": op.kube.api_requests}
    cycles = []
    end = datetime.fromtimestamp(t_end, timezone.utc)
    for label, now in (("first sighting", end - timedelta(minutes=5)), ("steady state", end)):
        q0, k0, p0 = query_requests(url), op.kube.api_requests, prometheus_cpu(url)
        c0, w0 = time.process_time(), time.perf_counter()
        profile = os.environ.get("BENCH_PROFILE")  # a file: cProfile of the steady-state cycle
        if profile and label == "steady state":
            import cProfile

            prof = cProfile.Profile()
            result = prof.runcall(op.runner.run, now=now)
            prof.dump_stats(profile)
        else:
            result = op.runner.run(now=now)
        cycles.append(
            {
                "cycle": label,
                "wall_s": time.perf_counter() - w0,
                "cpu_s": time.process_time() - c0,
                "queries": query_requests(url) - q0,
                "prometheus_cpu_s": prometheus_cpu(url) - p0,
                "kube_requests": op.kube.api_requests - k0,
                "window_s": result.window.seconds if result.window else 0,
                "jobs": len(result.summaries),
            }
        )
    op.shutdown()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"sync": sync, "cycles": cycles, "peak_rss_mb": peak}))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], float(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--pods", type=int, default=10, help="pods per job (1 GPU each)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--ages", default="1h,24h", help=f"comma-separated, of {', '.join(AGES)}")
    ap.add_argument(
        "--store",
        default="sqlite",
        help="the operator's store(s), comma-separated: sqlite (a file), postgresql (a fresh database in "
        "the test bed's PostgreSQL)",
    )
    ap.add_argument(
        "--baseline",
        metavar="DIR",
        help="also measure the product at DIR (e.g. `git archive OLD auditor | tar -x -C DIR`) on the same "
        "pods and history, before the current code: a before/after ratio from one run",
    )
    ap.add_argument(
        "--after",
        metavar="DIR",
        help="with --baseline: the product measured as 'after' from DIR instead of this checkout (a snapshot "
        "that edits during the run cannot reach)",
    )
    ap.add_argument(
        "--also",
        metavar="LABEL=DIR",
        action="append",
        default=[],
        help="with --baseline: a further product measured between 'before' and 'after' (repeatable), e.g. "
        "one helper's changes alone",
    )
    ap.add_argument("--repeat", type=int, default=1, help="operator runs per code and store (interleaved)")
    ap.add_argument("--keep", metavar="STATE", help="keep the pods and the history; write where they are to STATE")
    ap.add_argument("--reuse", metavar="STATE", help="measure on the pods and history a --keep run left")
    ap.add_argument("--tag", default="", help="suffix of the results' file names")
    args = ap.parse_args()
    stores = args.store.split(",")
    for st in stores:
        if st not in ("sqlite", "postgresql"):
            ap.error(f"--store {st}: sqlite or postgresql")
    codes: list[tuple[str, str | None]] = [("before", args.baseline)] if args.baseline else []
    for also in args.also:
        label, sep, code_dir = also.partition("=")
        if not sep or not label or not code_dir:
            ap.error(f"--also {also}: LABEL=DIR")
        codes.append((label, code_dir))
    codes.append(("after" if args.baseline else "current", args.after))

    from auditor.kube.client import KubeConfig, api_client
    from auditor.testbed import attach, down, up

    bed, private = attach(), None
    if bed is None:
        if args.reuse or args.keep:
            ap.error("--keep/--reuse need the running test bed")
        private = Path(tempfile.mkdtemp(prefix="gpa-opbench-bed-"))
        log("no running test bed: starting a private one")
        bed = up(private)
    api = api_client(KubeConfig(kubeconfig=bed.kubeconfig))
    rows = []
    state: dict = json.loads(Path(args.reuse).read_text()) if args.reuse else {}
    try:
        for label in args.ages.split(","):
            age_s = AGES[label]
            if label in state:
                kept = state[label]
                t_end, namespace, work = kept["t_end"], kept["namespace"], Path(kept["work"])
                args.jobs, args.pods, created = kept["jobs"], kept["pods"], 0.0
                log(f"age {label}: reusing {namespace} ({args.jobs} x {args.pods} pods) and {work}")
            else:
                t_end = time.time() // 300 * 300
                namespace = f"bench-op-{label}-{uuid.uuid4().hex[:6]}"
                log(f"age {label}: creating {args.jobs} jobs x {args.pods} GPU pods in {namespace}")
                created = create_jobs(
                    api, namespace, args.jobs, args.pods, datetime.fromtimestamp(t_end - age_s, timezone.utc)
                )
                work = Path(tempfile.mkdtemp(prefix=f"gpa-opbench-{label}-"))
                (work / "data").mkdir()
                log(f"age {label}: writing {age_s // INTERVAL_S} samples x 9 metrics for {args.jobs * args.pods} GPUs")
                write_history(
                    work / "data",
                    jobs=args.jobs,
                    pods_per_job=args.pods,
                    gpus=1,
                    end=int(t_end),
                    seconds=age_s,
                    interval=INTERVAL_S,
                    namespace=namespace,
                )
                state[label] = {
                    "t_end": t_end,
                    "namespace": namespace,
                    "work": str(work),
                    "jobs": args.jobs,
                    "pods": args.pods,
                }
                if args.keep:
                    Path(args.keep).write_text(json.dumps(state, indent=2))
            prom = PrivatePrometheus(work / "data")
            try:
                for rep in range(args.repeat):
                    for code, code_dir in codes:
                        for store in stores:
                            res = _measure(bed, work, prom, label, store, code_dir, t_end)
                            res.update(
                                {
                                    "age": label,
                                    "pods": args.jobs * args.pods,
                                    "jobs": args.jobs,
                                    "create_s": created,
                                    "store": store,
                                    "code": code,
                                    "repeat": rep,
                                }
                            )
                            log(f"age {label} {code} {store}: {json.dumps(res)}")
                            rows.append(res)
            finally:
                prom.stop()
                if not (args.keep or args.reuse):
                    shutil.rmtree(work, ignore_errors=True)
                    _delete_namespace(api, namespace)
    finally:
        if private is not None:
            down(private, quiet=True)
    write_results(Path(args.out), rows, args.tag)
    return 0


def _measure(bed, work: Path, prom: PrivatePrometheus, label: str, store: str, code_dir: str | None, t_end: float):
    """One operator process (fresh store) for two cycles; its figures, with the load average around it."""
    database = f"opbench_{uuid.uuid4().hex[:12]}"
    db_file = work / f"store-{database}.db"
    store_url = (
        f"sqlite:///{db_file}" if store == "sqlite" else _database(bed.postgres_admin_url, database, create=True)
    )
    load_before = os.getloadavg()[0]
    try:
        settings = work / "settings.yaml"
        settings.write_text(
            json.dumps(
                {
                    "cluster": f"bench-{label}",
                    "kubernetes": {"kubeconfig": bed.kubeconfig},
                    "prometheus": {"url": prom.url, "label_convention": "pod"},
                    "store": {"url": store_url},
                    "leader_election": {"enabled": False},
                    "features": {"annotate": False, "events": False, "kueue": True, "requeue": False},
                    "max_lookback": "2d",
                }
            )
        )
        env = dict(os.environ)
        if code_dir:  # the product from there (the editable install's finder comes after PYTHONPATH)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [code_dir, env.get("PYTHONPATH")]))
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(settings), str(t_end)],
            capture_output=True,
            text=True,
            env=env,
            cwd=work,
        )
        if out.returncode != 0:
            raise RuntimeError(f"operator failed:\n{out.stderr[-4000:]}")
        res = json.loads(out.stdout.strip().splitlines()[-1])
        res["load"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        return res
    finally:
        if store == "postgresql":
            _database(bed.postgres_admin_url, database, create=False)
        db_file.unlink(missing_ok=True)


def _database(admin_url: str, name: str, *, create: bool) -> str:
    """Create (or drop) a database beside the test bed's maintenance one; its URL."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"' if create else f'DROP DATABASE IF EXISTS "{name}"')
    parts = urlsplit(admin_url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def _delete_namespace(api, namespace: str) -> None:
    from auditor.kube.client import call_json, resource_path

    try:
        call_json(api, resource_path("v1", "namespaces", None, namespace), method="DELETE")
    except Exception as exc:  # noqa: BLE001 - cleanup only; the namespace controller finishes it
        log(f"could not delete namespace {namespace}: {exc}")


def write_results(out: Path, rows: list[dict], tag: str = "") -> None:
    out.mkdir(parents=True, exist_ok=True)
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d") + (f"-{tag}" if tag else "")
    machine = f"{platform.node()} ({os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()})"
    (out / f"operator-{day}.json").write_text(json.dumps({"date": day, "machine": machine, "rows": rows}, indent=2))
    lines = [
        f"# Operator cycle benchmark, {day}",
        "",
        f"Machine: {machine}. Test-bed kube-apiserver v1.36.3 (RBAC on); private Prometheus 2.42 with "
        f"TSDB blocks written by bench/tsdbgen; history at {INTERVAL_S} s, 9 DCGM metrics; stores: SQLite file, "
        "PostgreSQL 15 (the test bed). Load: the 1-minute load average before / after each operator process.",
        "",
        "| code | store | job age | GPU pods | informer sync s | sync kube requests | cycle | window | wall s | "
        "CPU s | Prometheus CPU s | queries | kube requests | jobs | peak RSS MB | load |",
        "|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        for c in r["cycles"]:
            lines.append(
                f"| {r.get('code', 'current')} | {r.get('store', 'sqlite')} | {r['age']} | {r['pods']} | "
                f"{r['sync']['seconds']:.2f} | {r['sync']['kube_requests']} | "
                f"{c['cycle']} | {c['window_s'] / 60:.0f} min | {c['wall_s']:.2f} | {c['cpu_s']:.2f} | "
                f"{c.get('prometheus_cpu_s', 0):.2f} | {c['queries']} | {c['kube_requests']} | {c['jobs']} | "
                f"{r['peak_rss_mb']:.0f} | {' / '.join(str(x) for x in r.get('load', []))} |"
            )
    (out / f"operator-{day}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
