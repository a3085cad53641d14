"""Benchmark: the store's side of an operator cycle (issue 18's "write"), several code versions in one run.

What a steady cycle hands the store, without the read and the summary around it: N jobs x P GPU
pods x 9 metrics, one new 5-minute bucket per series per cycle (the buckets as the Prometheus
source makes them: one pod, GPU and time object shared by a run), written as the operator's cycle
writes them (``upsert_jobs`` + ``replace_buckets_many`` in groups of 50,000 buckets, then the
chunk's ``save_aggregates`` and ``save_summaries``), in one ``Store.batch()`` per cycle. The
aggregates and summaries are the core's own (folded and summarized outside the timing). Each
code version and store runs in its own process, interleaved with the others; the figures are
CPU seconds per cycle of the store calls (the commit included), the least over the cycles after
the first (on a shared machine the least is the figure least disturbed by others' work).

Usage: ``.venv/bin/python bench/write_bench.py --code before=DIR --code after=DIR [--jobs 1000]
[--store sqlite,postgresql] [--cycles 5] [--repeat 2]`` (DIR: ``git archive REV auditor | tar -x
-C DIR``; PostgreSQL: a fresh database in the test bed's server).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import log
from operator_bench import _database

GROUP = 50_000  # buckets per group write, as auditor.engine._WRITE_GROUP


def child(url: str, jobs: int, pods: int, cycles: int) -> None:
    """The measured side: ``cycles`` steady cycles against the store at ``url``."""
    from datetime import datetime, timedelta, timezone

    from auditor.core.accumulate import JobAggregate
    from auditor.core.metrics import Metric
    from auditor.core.model import Bucket, GpuId, JobRef, PodRef, Window
    from auditor.core.summary import summarize_aggregate
    from auditor.engine import gc_paused
    from auditor.store import Store

    store = Store.open(url)
    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
    width = timedelta(minutes=5)
    metrics = [Metric.GPU_UTIL, Metric.SM_ACTIVE, Metric.SM_OCCUPANCY, Metric.TENSOR_ACTIVE, Metric.DRAM_ACTIVE]
    metrics += [m for m in Metric if m not in metrics][: 9 - len(metrics)]
    refs = [
        JobRef("bench", f"ns-{j % 50:02d}", "Job", f"job-{j:05d}", uid=f"uid-{j}", team="bench") for j in range(jobs)
    ]
    pod_refs = [[PodRef(r.namespace, f"{r.name}-{p}", "main") for p in range(pods)] for r in refs]
    gpu_ids = [
        [
            GpuId(uuid=f"GPU-{j:05d}-{p}", instance="", hostname=f"node-{j % 500}", index="0", model="H200")
            for p in range(pods)
        ]
        for j in range(jobs)
    ]
    aggs = [JobAggregate() for _ in refs]
    rows = []
    for k in range(cycles):
        start = t0 + k * width
        end = start + width
        items = []
        for j in range(jobs):
            value = 100.0 * ((j * 7 + k) % 10) / 10
            items.append(
                [
                    Bucket(pod_refs[j][p], gpu_ids[j][p], m, start, end, value * 20, 20, value * 0.9, value, 0)
                    for p in range(pods)
                    for m in metrics
                ]
            )
        with gc_paused():
            summaries = []
            for j, buckets in enumerate(items):  # the core's work, not timed
                aggs[j].fold(buckets, {})
                aggs[j].freeze(end)
                aggs[j].interval = 15.0
                summaries.append(
                    summarize_aggregate(refs[j], aggs[j], window=Window(t0, end), now=end, interval=15.0).to_json()
                )
            c0 = time.process_time()
            with store.batch():
                ids: list[int] = []
                group: list[tuple[JobRef, list]] = []
                size = 0
                for j, buckets in enumerate(items):
                    group.append((refs[j], buckets))
                    size += len(buckets)
                    if size < GROUP and j < jobs - 1:
                        continue
                    got = store.upsert_jobs([(r, start, end) for r, _b in group])
                    store.replace_buckets_many(list(zip(got, (b for _r, b in group))))
                    ids += got
                    group, size = [], 0
                c1 = time.process_time()
                store.save_aggregates(list(zip(ids, aggs)), end)
                c2 = time.process_time()
                store.save_summaries(list(zip(ids, summaries)))
                c3 = time.process_time()
            c4 = time.process_time()
        rows.append({"buckets_s": c1 - c0, "aggregates_s": c2 - c1, "summaries_s": c3 - c2, "commit_s": c4 - c3})
    store.close()
    print(json.dumps(rows))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--code", action="append", default=[], metavar="LABEL=DIR", help="a product to measure (repeatable)"
    )
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=10)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--store", default="sqlite,postgresql")
    args = ap.parse_args()
    codes = [c.partition("=")[::2] for c in args.code] or [("current", "")]
    from auditor.testbed import attach

    bed = attach() if "postgresql" in args.store else None
    results: dict[tuple[str, str], list[dict]] = {}
    for rep in range(args.repeat):
        for label, code_dir in codes:
            for store in args.store.split(","):
                with tempfile.TemporaryDirectory() as tmp:
                    if store == "sqlite":
                        url = f"sqlite:///{tmp}/store.db"
                    else:
                        if bed is None:
                            raise SystemExit("--store postgresql needs the running test bed")
                        url = _database(bed.postgres_admin_url, f"wbench_{uuid.uuid4().hex[:10]}", create=True)
                    env = dict(os.environ)
                    if code_dir:
                        env["PYTHONPATH"] = os.pathsep.join(filter(None, [code_dir, env.get("PYTHONPATH")]))
                    load = os.getloadavg()[0]
                    try:
                        out = subprocess.run(
                            [
                                sys.executable,
                                __file__,
                                "--child",
                                url,
                                str(args.jobs),
                                str(args.pods),
                                str(args.cycles),
                            ],
                            capture_output=True,
                            text=True,
                            env=env,
                            check=False,
                        )
                    finally:
                        if store == "postgresql":
                            _database(bed.postgres_admin_url, url.rsplit("/", 1)[1], create=False)  # type: ignore[union-attr]
                    if out.returncode:
                        raise SystemExit(f"{label} {store}: {out.stderr[-3000:]}")
                    cycles = json.loads(out.stdout.strip().splitlines()[-1])[1:]
                    for c in cycles:
                        c["load"] = load
                    results.setdefault((label, store), []).extend(cycles)
                    log(f"{label} {store} repeat {rep}: {json.dumps(cycles)}")
    shape = f"{args.jobs} jobs x {args.pods} GPUs x 9 metrics, least per steady cycle of {len(codes)} x {args.repeat}"
    print(f"| code | store | buckets s | aggregates s | summaries s | commit s | total s | load | ({shape}) |")
    print("|---|---|---:|---:|---:|---:|---:|---|---|")
    for (label, store), cycles in results.items():
        least = {k: min(c[k] for c in cycles) for k in ("buckets_s", "aggregates_s", "summaries_s", "commit_s")}
        loads = [c["load"] for c in cycles]
        print(
            f"| {label} | {store} | {least['buckets_s']:.3f} | {least['aggregates_s']:.3f} | {least['summaries_s']:.3f} | "
            f"{least['commit_s']:.3f} | {sum(least.values()):.3f} | {min(loads):.1f}-{max(loads):.1f} | |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
