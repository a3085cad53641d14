"""The node agent's CPU cost per GPU per 1 s sample on a real GPU, and where it goes (issue 18).

Run on the GPU machine from the repository root (``PYTHONPATH=$PWD python3 bench/agent_cpu_bench.py``).
Three parts, all written to ``$OUT/agent-cpu.json`` (``./agent-cpu.json`` without ``OUT``):

1. **Per call**: each NVML read the sampler makes, repeated (CPU time of this thread, user +
   system, and wall per call), on GPU 0 while a bf16 matrix-product load runs in another process
   (a busy GPU is the case that matters; the load's process has its own GIL).
2. **Per sample, in process**: ``NvmlSampler(gpm=True).sample()`` every 0.25 s, CPU time per call;
   and the same for an older sampler when ``--old FILE`` names a copy of an older
   ``auditor/agent/nvml.py`` (the before/after of one run).
3. **The agent's own figure**: ``python -m auditor.agent --source gpm --interval 1s`` for
   ``--seconds``, under the load, then its self-metrics:
   ``gpu_auditor_agent_sample_cpu_seconds_total / gpu_auditor_agent_samples_total /
   gpu_auditor_agent_devices`` (what docs/agent.md tells an operator to compute), plus the
   process's whole CPU time. With ``--old`` the older sampler is run the same way.

Needs torch (the load), nvidia-ml-py, prometheus-client; no network.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
"""

LAUNCH_OLD = """
import runpy, sys, importlib.util
spec = importlib.util.spec_from_file_location("old_nvml", sys.argv.pop(1))
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
import auditor.agent.nvml as nvml
nvml.NvmlSampler = lambda gpm=True, **_: old.NvmlSampler(gpm=gpm)  # an older one knows no pacing
sys.argv[0] = "auditor.agent"
runpy.run_module("auditor.agent", run_name="__main__")
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def start_load(seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", LOAD, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()  # "ready": the GPU is busy from here on
    return proc


def per_call(reps: int) -> dict[str, dict[str, float]]:
    """CPU and wall microseconds per call of each NVML read, on GPU 0."""
    import pynvml as N

    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    from auditor.agent.fields import GPM_FIELDS

    s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmSampleGet(h, s1)
    time.sleep(0.1)
    N.nvmlGpmSampleGet(h, s2)

    def metrics_get() -> None:
        mg = N.c_nvmlGpmMetricsGet_t()
        mg.version = N.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(GPM_FIELDS)
        mg.sample1, mg.sample2 = s1, s2
        for i, f in enumerate(GPM_FIELDS):
            mg.metrics[i].metricId = f.gpm_id
        N.nvmlGpmMetricsGet(mg)

    prepared = N.c_nvmlGpmMetricsGet_t()
    prepared.version = N.NVML_GPM_METRICS_GET_VERSION
    prepared.numMetrics = len(GPM_FIELDS)
    for i, f in enumerate(GPM_FIELDS):
        prepared.metrics[i].metricId = f.gpm_id

    def metrics_get_prepared() -> None:
        prepared.sample1, prepared.sample2 = s1, s2
        N.nvmlGpmMetricsGet(prepared)

    calls: dict[str, Callable[[], Any]] = {
        "nvmlDeviceGetUtilizationRates": lambda: N.nvmlDeviceGetUtilizationRates(h),
        "nvmlDeviceGetMemoryInfo": lambda: N.nvmlDeviceGetMemoryInfo(h),
        "nvmlDeviceGetPowerUsage": lambda: N.nvmlDeviceGetPowerUsage(h),
        "nvmlDeviceGetClockInfo(SM)": lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM),
        "nvmlDeviceGetClockInfo(MEM)": lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM),
        "nvmlDeviceGetMaxClockInfo(SM)": lambda: N.nvmlDeviceGetMaxClockInfo(h, N.NVML_CLOCK_SM),
        "nvmlDeviceGetFieldValues(POWER_INSTANT)": lambda: N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_POWER_INSTANT]),
        "nvmlGpmSampleGet": lambda: N.nvmlGpmSampleGet(h, s2),
        "nvmlGpmMetricsGet (struct built each call)": metrics_get,
        "nvmlGpmMetricsGet (prepared struct)": metrics_get_prepared,
    }
    out: dict[str, dict[str, float]] = {}
    for name, fn in calls.items():
        try:
            fn()
        except N.NVMLError as exc:
            out[name] = {"error": str(exc)}  # type: ignore[dict-item]
            continue
        c0, w0 = time.thread_time(), time.perf_counter()
        for _ in range(reps):
            fn()
        c1, w1 = time.thread_time(), time.perf_counter()
        out[name] = {"cpu_us": round(1e6 * (c1 - c0) / reps, 1), "wall_us": round(1e6 * (w1 - w0) / reps, 1)}
        log(f"  {name}: {out[name]}")
    # is the metrics request's cost per metric or per request?
    for n in (1, 2, 5, len(GPM_FIELDS)):
        prepared.numMetrics = n
        c0 = time.thread_time()
        for _ in range(50):
            metrics_get_prepared()
        out[f"nvmlGpmMetricsGet, {n} metrics"] = {"cpu_us": round(1e6 * (time.thread_time() - c0) / 50, 1)}
        log(f"  {n} metrics: {out[f'nvmlGpmMetricsGet, {n} metrics']}")
    for f in GPM_FIELDS:
        prepared.numMetrics = 1
        prepared.metrics[0].metricId = f.gpm_id
        c0 = time.thread_time()
        for _ in range(30):
            metrics_get_prepared()
        out[f"nvmlGpmMetricsGet, only {f.name}"] = {"cpu_us": round(1e6 * (time.thread_time() - c0) / 30, 1)}
    log("  one metric each: " + ", ".join(f"{k[24:]}={v['cpu_us']}" for k, v in out.items() if "only" in k))
    # at the agent's pace (1 s), on fresh sample pairs, which the driver may serve differently:
    # the sample, the metrics without GR_ENGINE_ACTIVE, GR_ENGINE_ACTIVE alone
    fast = [f for f in GPM_FIELDS if f.name != "DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    timings: dict[str, list[float]] = {"sample": [], "metrics without GR_ENGINE": [], "GR_ENGINE alone": []}
    bufs = [s1, s2]
    for i in range(12):
        time.sleep(1.0)
        first, second = bufs[i % 2], bufs[(i + 1) % 2]
        c0 = time.thread_time()
        N.nvmlGpmSampleGet(h, second)
        c1 = time.thread_time()
        prepared.numMetrics = len(fast)
        for j, f in enumerate(fast):
            prepared.metrics[j].metricId = f.gpm_id
        prepared.sample1, prepared.sample2 = first, second
        c2 = time.thread_time()
        N.nvmlGpmMetricsGet(prepared)
        c3 = time.thread_time()
        prepared.numMetrics = 1
        prepared.metrics[0].metricId = 1
        c4 = time.thread_time()
        N.nvmlGpmMetricsGet(prepared)
        c5 = time.thread_time()
        if i:
            timings["sample"].append(c1 - c0)
            timings["metrics without GR_ENGINE"].append(c3 - c2)
            timings["GR_ENGINE alone"].append(c5 - c4)
    for k, v in timings.items():
        out[f"at 1 s pace, fresh pair: {k}"] = {"cpu_us": round(1e6 * statistics.mean(v), 1)}
        log(f"  at 1 s pace, {k}: {out[f'at 1 s pace, fresh pair: {k}']}")
    N.nvmlGpmSampleFree(s1)
    N.nvmlGpmSampleFree(s2)
    N.nvmlShutdown()
    return out


def load_old(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("old_nvml", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def per_sample(sampler_cls: Any, n: int, pace: float) -> dict[str, float]:
    sampler = sampler_cls(gpm=True)
    devices = len(sampler.devices())
    sampler.sample()  # the first tick takes the first GPM sample only
    cpu: list[float] = []
    for _ in range(n):
        time.sleep(pace)
        c0 = time.thread_time()
        values = sampler.sample()
        cpu.append(time.thread_time() - c0)
    sampler.close()
    fields = sorted(next(iter(values.values())))
    return {
        "devices": devices,
        "samples": n,
        "cpu_ms_per_sample_mean": round(1e3 * statistics.mean(cpu), 3),
        "cpu_ms_per_sample_median": round(1e3 * statistics.median(cpu), 3),
        "cpu_ms_per_gpu_per_sample": round(1e3 * statistics.mean(cpu) / devices, 3),
        "fields": len(fields),
    }


def agent_run(seconds: float, old: str | None, *extra: str) -> dict[str, Any]:
    from agent_h200_validation import AgentProcess, _proc_cpu, self_metric

    saved = sys.executable
    if old:
        # the same agent with the older sampler: AgentProcess runs ``python -m auditor.agent``,
        # so point it at a launcher that swaps the class first
        launcher = Path(tempfile.mkdtemp()) / "old_agent.py"
        launcher.write_text(LAUNCH_OLD)
        argv0 = saved
        wrapper = Path(tempfile.mkdtemp()) / "python"
        wrapper.write_text(
            f'#!/bin/sh\nif [ "$1" = "-m" ] && [ "$2" = "auditor.agent" ]; then shift 2; '
            f'exec {argv0} {launcher} {old} "$@"; fi\nexec {argv0} "$@"\n'
        )
        wrapper.chmod(0o755)
        sys.executable = str(wrapper)
    try:
        agent = AgentProcess("--source", "gpm", "--interval", "1s", "--pod-resources-socket", "", *extra)
    finally:
        sys.executable = saved
    try:
        first = agent.scrape("bench")
        c0 = self_metric(first, "gpu_auditor_agent_sample_cpu_seconds_total") or 0.0
        n0 = self_metric(first, "gpu_auditor_agent_samples_total") or 0.0
        p0 = _proc_cpu(agent.proc.pid) or 0.0
        time.sleep(seconds)
        last = agent.scrape("bench")
        c1 = self_metric(last, "gpu_auditor_agent_sample_cpu_seconds_total") or 0.0
        n1 = self_metric(last, "gpu_auditor_agent_samples_total") or 0.0
        p1 = _proc_cpu(agent.proc.pid) or 0.0
        devices = self_metric(last, "gpu_auditor_agent_devices") or 1.0
        backend = [lb.get("backend") for n, lb, _ in last if n == "gpu_auditor_agent_info"]
        return {
            "backend": backend[0] if backend else None,
            "devices": devices,
            "whole_life": {
                "sampling_cpu_seconds": round(c1, 4),
                "samples": n1,
                "cpu_ms_per_gpu_per_sample": round(1e3 * c1 / n1 / devices, 3),
            },
            "steady": {
                "samples": n1 - n0,
                "cpu_ms_per_gpu_per_sample": round(1e3 * (c1 - c0) / (n1 - n0) / devices, 3),
                "process_cpu_ms_per_second": round(1e3 * (p1 - p0) / seconds, 2),
            },
        }
    finally:
        agent.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", help="an older auditor/agent/nvml.py to measure beside the current one")
    ap.add_argument("--seconds", type=float, default=60.0, help="length of each agent run (default 60)")
    ap.add_argument("--reps", type=int, default=300)
    args = ap.parse_args()
    import pynvml

    from auditor.agent import nvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    result: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gpu": str(pynvml.nvmlDeviceGetName(h)),
        "gpu_count": pynvml.nvmlDeviceGetCount(),
        "driver": str(pynvml.nvmlSystemGetDriverVersion()),
        "kernel": platform.release(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "nvidia_ml_py": getattr(pynvml, "__version__", None),
    }
    pynvml.nvmlShutdown()
    total = 120 + 3 * 15 + (4 if args.old else 3) * (args.seconds + 15)
    load = start_load(total)
    try:
        log("per call, under load")
        result["per_call"] = per_call(args.reps)
        log("per sample, in process")
        result["per_sample"] = {
            "current": per_sample(nvml.NvmlSampler, 60, 0.25),
            "current, slow_every=10": per_sample(functools.partial(nvml.NvmlSampler, slow_every=10), 60, 0.25),
        }
        if args.old:
            result["per_sample"]["old"] = per_sample(load_old(args.old).NvmlSampler, 60, 0.25)
        log(f"  {result['per_sample']}")
        log(f"agent process, {args.seconds:.0f} s")
        result["agent"] = {
            f"current, --profiling-interval {p} --gr-engine-interval {g}": agent_run(
                args.seconds, None, "--profiling-interval", p, "--gr-engine-interval", g
            )
            for p, g in (("1s", "1s"), ("1s", "10s"), ("2s", "10s"))
        }
        if args.old:
            result["agent"]["old"] = agent_run(args.seconds, args.old)
        log(f"  {result['agent']}")
    finally:
        load.terminate()
        load.wait(10)
        out = Path(os.environ.get("OUT", ".")) / "agent-cpu.json"
        out.write_text(json.dumps(result, indent=2) + "\n")  # what was measured, also after a failure
        log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
