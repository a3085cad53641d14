"""Benchmark (issue 18): a job's summary in the operator's steady cycle, in process, no servers.

Builds N jobs x G GPUs (one pod per GPU, as ``operator_bench.py --pods``) of kept aggregates:
9 metrics (tsdbgen's), 1 h of 5-minute buckets at a 15 s scrape interval folded and frozen,
values varying per job, GPU and bucket. Then runs steady cycles and times each job's work as
the engine's ``_fold_cumulative`` and ``audit`` do it: fold the bucket that closed into the
kept aggregate and freeze it, copy it, fold the still-open bucket into the copy
(``fold``), ``summarize_aggregate`` (``summary``), ``JobSummary.to_json`` (``to_json``), and
the kept aggregate's ``to_json`` the store saves (``state``, reported apart). CPU is
``time.process_time``; RSS the child's peak.

``--baseline DIR`` runs the same cycles in a subprocess with ``PYTHONPATH=DIR`` (an
``auditor`` snapshot: ``git archive REV auditor | tar -x -C DIR``) and the current tree in
another, alternately, so before and after come from one run under the same load; the
documents of both are hashed and must be equal (no output changes).

Usage: ``.venv/bin/python bench/summary_bench.py [--jobs 1000] [--gpus 10] [--cycles 3]
[--baseline DIR] [--out bench/results/summary-DATE.md] [--profile FILE]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import resource
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
WIDTH = timedelta(minutes=5)
INTERVAL = 15.0
FULL = 20  # samples in a full 5-minute bucket at 15 s
HISTORY = 12  # buckets folded and frozen before the first cycle (1 h; ``--history``)
PHASES = ("fold", "summary", "to_json", "state")


def _child(args: argparse.Namespace) -> dict:
    """Build the aggregates and run the cycles in this process (its imports from PYTHONPATH)."""
    from auditor.core.accumulate import JobAggregate
    from auditor.core.metrics import Metric
    from auditor.core.model import Bucket, GpuId, JobRef, PodRef, Window
    from auditor.core.summary import summarize_aggregate

    # tsdbgen's nine metrics with its per-job profile (frac = j % 10 / 10), in the audit's units
    def levels(j: int) -> dict:
        f = (j % 10) / 10.0
        return {
            Metric.GPU_UTIL: 1.0 if j % 7 else 0.02,
            Metric.GR_ENGINE_ACTIVE: 0.99 if j % 7 else 0.01,
            Metric.SM_ACTIVE: 0.05 + 0.9 * f,
            Metric.SM_OCCUPANCY: 0.5 * f,
            Metric.TENSOR_ACTIVE: 0.6 * f,
            Metric.DRAM_ACTIVE: 0.2,
            Metric.POWER: 200.0 + 400.0 * f,
            Metric.FB_USED: 40000.0,
            Metric.SM_CLOCK: 1980.0,
        }

    def buckets(j: int, rows: list, k: int, count: int, rnd: random.Random) -> list:
        """Bucket ``k`` (its start T0 + k x 5 min) of every row of job ``j``."""
        start = T0 + k * WIDTH
        end = start + WIDTH
        out = []
        for g, (pod, gpu) in enumerate(rows):
            for m, v in levels(j + g // 4).items():
                mean = v * (0.9 + 0.2 * rnd.random())
                if m.value.endswith("_active") or m is Metric.GPU_UTIL or m is Metric.SM_OCCUPANCY:
                    mean = min(mean, 1.0)
                dropped = 1 if (m is Metric.GPU_UTIL and (j + k + g) % 53 == 0) else 0
                out.append(Bucket(pod, gpu, m, start, end, mean * count, count, mean * 0.9, mean * 1.05, dropped))
        return out

    import gc

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    gc.collect()
    rss_before = rss_mb()
    jobs = []
    for j in range(args.jobs):
        rnd = random.Random(j)
        name = f"job-{j:05d}"
        rows = [
            (
                PodRef("bench", f"{name}-{g}", "main"),
                GpuId(f"GPU-{j:08d}-{g:04d}", hostname=f"node-{j:04d}-{g}", index="0", model="NVIDIA H200"),
            )
            for g in range(args.gpus)
        ]
        agg = JobAggregate()
        history = []
        for k in range(args.history):
            history += buckets(j, rows, k, FULL if k else 9, rnd)  # the job started inside its first bucket
        agg.fold(history, {})
        agg.freeze(T0 + args.history * WIDTH)
        agg.interval = INTERVAL
        jobs.append((JobRef("bench-cluster", "bench", "Job", name, uid=f"uid-{j}", team="bench"), rows, agg, rnd))
    del history
    gc.collect()
    kept_mb = rss_mb() - rss_before  # the kept aggregates (and the job list), as the operator holds them

    cpu = {p: 0.0 for p in PHASES}
    digest = hashlib.sha256()
    clock = time.process_time
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    cycles = []
    for c in range(args.cycles):
        k = args.history + c  # the bucket that closed since the last cycle; k + 1 is still open
        through = T0 + (k + 1) * WIDTH
        now = through + WIDTH
        window = Window(T0, now)
        work = [
            (job, agg, buckets(j, rows, k, FULL, rnd), buckets(j, rows, k + 1, 12, rnd))
            for j, (job, rows, agg, rnd) in enumerate(jobs)
        ]
        per = {p: 0.0 for p in PHASES}
        if profiler:
            profiler.enable()
        phases = args.phases
        for job, agg, done, tail in work:
            if "f" not in phases:
                continue
            t0 = clock()
            agg.fold(done, {})
            agg.freeze(through)
            view = agg.copy()
            view.fold(tail, {})
            t1 = clock()
            if "s" not in phases:
                continue
            summary = summarize_aggregate(job, view, window=window, now=now, interval=view.interval_for(view.interval))
            t2 = clock()
            if "j" not in phases:
                continue
            doc = summary.to_json()
            t3 = clock()
            state = agg.to_json()
            t4 = clock()
            per["fold"] += t1 - t0
            per["summary"] += t2 - t1
            per["to_json"] += t3 - t2
            per["state"] += t4 - t3
            if not args.digest:
                continue
            if profiler:
                profiler.disable()
            digest.update(json.dumps(doc, sort_keys=True, default=str).encode())
            digest.update(json.dumps(state, sort_keys=True).encode())
            if profiler:
                profiler.enable()
        if profiler:
            profiler.disable()
        cycles.append(per)
        for p in PHASES:
            cpu[p] += per[p]
    if profiler:
        profiler.dump_stats(args.profile)
    return {
        "cycles": cycles,
        "cpu_per_cycle_s": {p: cpu[p] / max(1, args.cycles) for p in PHASES},
        "per_job_s": (cpu["fold"] + cpu["summary"] + cpu["to_json"]) / max(1, args.cycles),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "kept_mb": kept_mb,
        "digest": digest.hexdigest(),
    }


def _run(path: Path, args: argparse.Namespace, profile: str | None = None) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--jobs",
        str(args.jobs),
        "--gpus",
        str(args.gpus),
        "--cycles",
        str(args.cycles),
        "--history",
        str(args.history),
    ]
    if profile:
        cmd += ["--profile", profile]
    env = {**os.environ, "PYTHONPATH": str(path)}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def _instructions(path: Path, jobs: int, gpus: int, cycles: int, history: int) -> dict[str, float]:
    """Instructions per job and cycle of each phase, counted by valgrind (cachegrind, no cache
    simulation): the same children with no phase (building the aggregates and each cycle's
    buckets) and with the phases added one at a time, each subtracting the one before.
    Much steadier than CPU seconds on a shared machine (runs here differed by up to ~10 %)."""

    def count(c: int, phases: str) -> int:
        cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
        cmd += [sys.executable, __file__, "--child", "--no-digest", "--jobs", str(jobs), "--gpus", str(gpus)]
        cmd += ["--cycles", str(c), "--phases", phases, "--history", str(history)]
        env = {**os.environ, "PYTHONPATH": str(path), "PYTHONHASHSEED": "0"}
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stderr
        line = next(x for x in out.splitlines() if "I   refs" in x or "I refs" in x)
        return int(line.split(":")[1].replace(",", "").split()[0])

    zero, fold, summary, both = count(cycles, ""), count(cycles, "f"), count(cycles, "fs"), count(cycles, "fsj")
    n = jobs * cycles
    return {
        "fold": (fold - zero) / n,
        "summary": (summary - fold) / n,
        "to_json_and_state": (both - summary) / n,
        "per_job": (both - zero) / n,
    }


def _git(*a: str, cwd: Path = REPO) -> str:
    r = subprocess.run(["git", *a], cwd=cwd, capture_output=True, text=True)
    return r.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=10)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument(
        "--history",
        type=int,
        default=HISTORY,
        help="5-minute buckets folded and frozen before the first cycle (12: 1 h; past 64 the centroids merge)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="alternate baseline/current runs this many times (the least CPU of each kept)",
    )
    ap.add_argument("--baseline", type=Path, help="an auditor snapshot to compare with (PYTHONPATH)")
    ap.add_argument("--baseline-rev", default="", help="the revision the snapshot was taken at (recorded)")
    ap.add_argument("--out", type=Path, help="write OUT (markdown) and OUT with .json")
    ap.add_argument("--profile", help="cProfile the current tree's cycles into this file")
    ap.add_argument(
        "--instructions",
        type=int,
        default=0,
        metavar="JOBS",
        help="also count CPU instructions per job and cycle (valgrind, JOBS jobs): a figure that other load "
        "on the machine does not move",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--phases", default="fsj", help=argparse.SUPPRESS)
    ap.add_argument("--no-digest", dest="digest", action="store_false", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args)))
        return 0
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {"baseline": [], "current": []}
    for r in range(args.rounds):
        if args.baseline:
            runs["baseline"].append(_run(args.baseline, args))
        runs["current"].append(_run(REPO, args, args.profile if r == 0 else None))
    instructions = {}
    if args.instructions:
        for name, path in (("baseline", args.baseline), ("current", REPO)):
            if path is not None:
                instructions[name] = _instructions(path, args.instructions, args.gpus, args.cycles, args.history)
    load_after = os.getloadavg()

    def best(rs: list[dict]) -> dict:
        return min(rs, key=lambda x: x["per_job_s"])

    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "host": platform.node(),
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
        },
        "load_average": {"before": load_before, "after": load_after},
        "revisions": {
            "current": _git("rev-parse", "HEAD")
            + (" + uncommitted" if _git("status", "--porcelain", "auditor") else ""),
            "baseline": args.baseline_rev or None,
        },
        "shape": {
            "jobs": args.jobs,
            "gpus_per_job": args.gpus,
            "metrics": 9,
            "history_buckets": args.history,
            "cycles": args.cycles,
        },
        "current": best(runs["current"]),
        "runs": runs,
    }
    if instructions:
        result["instructions_per_job_cycle"] = instructions
        result["instructions_shape"] = {"jobs": args.instructions, "gpus_per_job": args.gpus, "cycles": args.cycles}
    if args.baseline:
        b, c = best(runs["baseline"]), result["current"]
        result["baseline"] = b
        result["speedup_per_job"] = b["per_job_s"] / c["per_job_s"] if c["per_job_s"] else None
        result["same_output"] = all(x["digest"] == b["digest"] for x in runs["baseline"] + runs["current"])
    text = _markdown(result)
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result.get("same_output", True) else 1


def _markdown(r: dict) -> str:
    s = r["shape"]
    gpus = s["jobs"] * s["gpus_per_job"]
    lines = [
        f"# summary_bench: {s['jobs']:,} jobs x {s['gpus_per_job']} GPUs ({gpus:,} GPUs), steady cycle, {r['date']}",
        "",
        f"Machine {r['machine']['host']} ({r['machine']['cores']} cores, Python {r['machine']['python']}), "
        f"load average {r['load_average']['before'][0]:.2f} before / {r['load_average']['after'][0]:.2f} after. "
        f"Current {r['revisions']['current']}; baseline {r['revisions']['baseline']}. "
        f"CPU per cycle (mean of {s['cycles']} cycles, the lesser of {len(r['runs']['current'])} runs each), peak RSS of the process.",
        "",
        "| what | "
        + ("baseline s | " if "baseline" in r else "")
        + "current s | "
        + ("ratio |" if "baseline" in r else ""),
        "|---|" + ("---:|" if "baseline" in r else "") + "---:|" + ("---:|" if "baseline" in r else ""),
    ]
    names = {
        "fold": "fold (freeze, copy, open bucket)",
        "summary": "summarize_aggregate",
        "to_json": "JobSummary.to_json",
        "state": "JobAggregate.to_json (the saved state)",
    }
    for p in PHASES:
        c = r["current"]["cpu_per_cycle_s"][p]
        if "baseline" in r:
            b = r["baseline"]["cpu_per_cycle_s"][p]
            lines.append(f"| {names[p]} | {b:.3f} | {c:.3f} | {b / c if c else 0:.1f}x |")
        else:
            lines.append(f"| {names[p]} | {c:.3f} |")
    c = r["current"]["per_job_s"]
    if "baseline" in r:
        b = r["baseline"]["per_job_s"]
        lines.append(
            f"| **per-job summary work** (fold + summary + to_json) | **{b:.3f}** | **{c:.3f}** | **{b / c:.1f}x** |"
        )
        lines.append(f"| peak RSS MB | {r['baseline']['peak_rss_mb']:.0f} | {r['current']['peak_rss_mb']:.0f} | |")
        if "kept_mb" in r["baseline"] and "kept_mb" in r["current"]:
            lines.append(
                f"| kept aggregates MB (RSS growth building them) | {r['baseline']['kept_mb']:.0f} | "
                f"{r['current']['kept_mb']:.0f} | |"
            )
        lines += ["", f"Same documents and states in every run (sha256 of all): {r['same_output']}."]
    else:
        lines.append(f"| **per-job summary work** | **{c:.3f}** |")
        lines.append(f"| peak RSS MB | {r['current']['peak_rss_mb']:.0f} |")
    lines.append(f"Per GPU: {c / gpus * 1e3:.3f} ms of the summary work per cycle.")
    ins = r.get("instructions_per_job_cycle")
    if ins:
        sh = r["instructions_shape"]
        lines += [
            "",
            f"Instructions per job and cycle (valgrind, {sh['jobs']} jobs x {sh['gpus_per_job']} GPUs, "
            f"{sh['cycles']} cycles; load does not move them):",
            "",
            "| what | " + " | ".join(f"{k} M" for k in ins) + (" | ratio |" if len(ins) == 2 else " |"),
            "|---|" + "---:|" * (len(ins) + (1 if len(ins) == 2 else 0)),
        ]
        for key, label in (
            ("fold", "fold"),
            ("summary", "summarize_aggregate"),
            ("to_json_and_state", "to_json + state"),
            ("per_job", "**total**"),
        ):
            vals = [ins[k][key] / 1e6 for k in ins]
            ratio = f" {vals[0] / vals[1]:.2f}x |" if len(vals) == 2 and vals[1] else ""
            lines.append(f"| {label} | " + " | ".join(f"{v:.2f}" for v in vals) + " |" + ratio)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
