"""Where an operator's memory goes (issue 18): resident memory per phase of its cycles, what is
left after them, and what of it is live Python objects.

On the pods and history an ``operator_bench.py --keep STATE`` run left in the test bed (its
private Prometheus restarted on a copy of the data), one operator process (SQLite store) runs
the first sighting and two steady cycles while a thread samples its RSS every 20 ms, each sample
counted to the phase running then (the Kubernetes view, the read, the bucket writes, the folds
and summaries, the summary and aggregate writes). After each cycle: RSS, and RSS after
``gc.collect()`` and glibc ``malloc_trim(0)``; after the cycles, CPython's small-object
allocator (``sys._debugmallocstats``: its arenas, the bytes in live blocks and in free ones).
``--trace`` runs a second process under ``tracemalloc`` (1 frame, from before the imports of
the product: slow, ~10x) and lists the live objects by file after the steady cycle.

Usage: ``.venv/bin/python bench/memory_probe.py --reuse STATE [--age 1h] [--trace] [--code DIR
--code-rev REV] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import REPO, PrivatePrometheus, log

PHASES = (  # (module path, attribute, label) wrapped in the child
    ("auditor.engine", "_fold_cumulative", "fold"),
    ("auditor.engine", "summarize_aggregate", "summarize"),
)
STORE_CALLS = ("replace_buckets_many", "save_aggregates", "save_summaries", "record_run")
CYCLES = (("first sighting", -5), ("steady", 0), ("steady 2", 5))  # minutes from the state's t_end


def _child(settings: str, t_end: float, trace: bool) -> dict:
    if trace:
        import tracemalloc

        tracemalloc.start(1)
    import ctypes
    import gc
    import importlib
    import resource
    import threading
    import time
    from datetime import datetime, timedelta, timezone

    from auditor.operator_loop.service import Operator
    from auditor.settings import load_settings

    def rss() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    stack = ["start"]
    peaks: dict[str, float] = {}

    def sample() -> None:
        while True:
            r, p = rss(), stack[-1]
            peaks[p] = max(peaks.get(p, 0.0), r)
            time.sleep(0.02)

    def wrapped(f, label):
        def call(*a, **k):
            stack.append(f"{stack[0]}: {label}")
            try:
                return f(*a, **k)
            finally:
                stack.pop()

        return call

    for module, attr, label in PHASES:
        mod = importlib.import_module(module)
        setattr(mod, attr, wrapped(getattr(mod, attr), label))
    out: dict = {"imports_rss_mb": rss()}
    op = Operator(load_settings(settings))
    op.start(http=False)
    out["synced_rss_mb"] = rss()
    runner = op.runner
    runner.resolver.jobs = wrapped(runner.resolver.jobs, "Kubernetes view")
    runner.source.read_lazy = wrapped(runner.source.read_lazy, "read")
    for name in STORE_CALLS:
        setattr(runner.store, name, wrapped(getattr(runner.store, name), name))
    threading.Thread(target=sample, daemon=True).start()
    end = datetime.fromtimestamp(t_end, timezone.utc)
    libc = ctypes.CDLL("libc.so.6")
    out["cycles"] = []
    for label, minutes in CYCLES:
        stack[0] = label
        c0 = time.process_time()
        runner.run(now=end + timedelta(minutes=minutes))
        cpu = time.process_time() - c0
        after = rss()
        gc.collect()
        libc.malloc_trim(0)
        out["cycles"].append({"cycle": label, "cpu_s": cpu, "rss_after_mb": after, "rss_after_trim_mb": rss()})
    stack[0] = "after"
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["phase_peak_rss_mb"] = {k: v for k, v in peaks.items() if k not in ("start", "after")}
    sys._debugmallocstats()  # to the process's stderr (C level), which the parent reads
    if trace:
        import tracemalloc

        snap = tracemalloc.take_snapshot()
        stats = snap.statistics("filename")
        out["traced_live_mb"] = sum(s.size for s in stats) / 2**20
        out["traced_by_file"] = [
            {"file": _short(s.traceback[0].filename), "mb": s.size / 2**20, "objects": s.count} for s in stats[:15]
        ]
    op.shutdown()
    return out


def _short(path: str) -> str:
    for root in (str(REPO) + "/", sys.prefix + "/", sys.base_prefix + "/"):
        if path.startswith(root):
            return path[len(root) :]
    return path


def _pymalloc(text: str) -> dict:
    """The arena and block totals of a ``sys._debugmallocstats`` report."""
    want = {
        "# arenas allocated current": "arenas",
        "# bytes in allocated blocks": "live_block_bytes",
        "# bytes in available blocks": "free_block_bytes",
    }
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in want:
            out[want[key.strip()]] = int(value.strip().replace(",", ""))
    return out


def _run(state: dict, trace: bool, code: Path | None) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="gpa-memprobe-"))
    try:
        shutil.copytree(Path(state["work"]) / "data", tmp / "data")
        prom = PrivatePrometheus(tmp / "data")
        try:
            settings = json.loads((Path(state["work"]) / "settings.yaml").read_text())
            settings["prometheus"]["url"] = prom.url
            settings["store"] = {"url": f"sqlite:///{tmp}/store.db"}
            (tmp / "settings.yaml").write_text(json.dumps(settings))
            cmd = [sys.executable, __file__, "--child", str(tmp / "settings.yaml"), str(state["t_end"])]
            cmd += ["--trace"] if trace else []
            env = dict(os.environ)
            if code is not None:  # that product first (the editable install's finder comes after PYTHONPATH)
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH")]))
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"probe failed:\n{proc.stderr[-4000:]}")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            result["pymalloc"] = _pymalloc(proc.stderr)
            return result
        finally:
            prom.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _markdown(r: dict, t: dict | None) -> str:
    lines = [
        f"# Operator memory probe ({r['jobs']} jobs x {r['pods']} GPU pods, {r['age']} old, SQLite)",
        "",
        f"Code {r['revision']}; load {r['load'][0]:.2f} / {r['load'][1]:.2f}. RSS after the imports "
        f"{r['imports_rss_mb']:.0f} MB, after the informers' sync {r['synced_rss_mb']:.0f} MB; peak "
        f"{r['peak_rss_mb']:.0f} MB.",
        "",
        "| cycle | CPU s | RSS after MB | after gc + malloc_trim MB |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {c['cycle']} | {c['cpu_s']:.2f} | {c['rss_after_mb']:.0f} | {c['rss_after_trim_mb']:.0f} |"
        for c in r["cycles"]
    ]
    lines += ["", "| phase | peak RSS MB |", "|---|---:|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in r["phase_peak_rss_mb"].items()]
    pm = r["pymalloc"]
    if pm:
        lines += [
            "",
            f"CPython's small-object allocator after the cycles: {pm.get('arenas', 0)} arenas of 1 MiB, "
            f"{pm.get('live_block_bytes', 0) / 2**20:.0f} MiB in live blocks, "
            f"{pm.get('free_block_bytes', 0) / 2**20:.0f} MiB in free blocks inside them.",
        ]
    if t:
        lines += [
            "",
            f"Live Python objects after the steady cycle (tracemalloc from before the imports, a "
            f"separate run): {t['traced_live_mb']:.0f} MiB.",
            "",
            "| file | MiB | objects |",
            "|---|---:|---:|",
        ]
        lines += [f"| `{x['file']}` | {x['mb']:.1f} | {x['objects']} |" for x in t["traced_by_file"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reuse", metavar="STATE", help="the state an operator_bench.py --keep run wrote")
    ap.add_argument("--age", default="1h", help="which of the state's ages (1h, 24h, 7d)")
    ap.add_argument("--trace", action="store_true", help="also list the live objects (tracemalloc; slow)")
    ap.add_argument("--out", type=Path, help="write OUT (markdown) and OUT with .json")
    ap.add_argument(
        "--code", type=Path, help="probe the product at DIR (`git archive REV auditor | tar -x -C DIR`), not this tree"
    )
    ap.add_argument("--code-rev", default="", help="with --code: the revision DIR holds (recorded)")
    ap.add_argument("--child", nargs=2, metavar=("SETTINGS", "T_END"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child[0], float(args.child[1]), args.trace)))
        return 0
    if not args.reuse:
        ap.error("--reuse STATE: the pods and history of an operator_bench.py --keep run")
    state = json.loads(Path(args.reuse).read_text())[args.age]
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "auditor"], cwd=REPO, capture_output=True, text=True)
    before = os.getloadavg()[0]
    log(f"probe: {state['jobs']} x {state['pods']} pods, {args.age}")
    result = _run(state, trace=False, code=args.code)
    result.update(
        jobs=state["jobs"],
        pods=state["pods"],
        age=args.age,
        revision=(args.code_rev or str(args.code))
        if args.code
        else rev.stdout.strip() + (" + uncommitted" if dirty.stdout.strip() else ""),
        load=[before, os.getloadavg()[0]],
    )
    traced = None
    if args.trace:
        log("probe: again under tracemalloc (slow)")
        traced = _run(state, trace=True, code=args.code)
        result["traced"] = traced
    text = _markdown(result, traced)
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
