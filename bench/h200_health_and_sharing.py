"""Record, on one GPU (an H200), what issues 32 and 33 need and no earlier recording has.

``--group hang`` (issue 33, hung collectives): a few thread blocks polling a flag in device memory
that never changes, as NCCL's ranks do while a peer is dead or deadlocked — on 2, 8 and 32 SMs of
132 — beside an idle phase with memory held and a bf16 matrix loop at full power. Each ends on a
clock64 budget, so no host interaction is needed. A side sampler reads NVML once a second for
what DCGM's health fields carry: the clock-event (throttle) reasons bitmask, SM clock, power,
temperature, and at start/end the ECC and row-remap counters (Xid errors come only as NVML events:
recorded as the count of events seen, with their data).

``--group share`` (issue 32, time-sliced GPUs): two or three processes sharing GPU 0 (a bf16
training-like matrix loop, a small-batch inference MLP, an idle process holding memory), each
first alone and then in mixes, each reporting its own steps/s; a side sampler reads
``nvmlDeviceGetProcessUtilization`` (per-PID SM and memory utilisation samples) and
``nvmlDeviceGetComputeRunningProcesses`` (per-PID memory) once a second.

Both groups record the device series through our own agent (``bench/h200_workloads.py``'s
recorder, one row a second with the phase), so the CSV has the same columns as
``auditor/data/h200-workloads.csv``; the side samplers write ``<name>.nvml.csv``.

    PYTHONPATH=$PWD python3 bench/h200_health_and_sharing.py --group hang    # $OUT/h200-hang.{csv,nvml.csv,truth.json}
    PYTHONPATH=$PWD python3 bench/h200_health_and_sharing.py --group share   # $OUT/h200-share.{...}
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_h200_validation import log
from h200_workloads import finish_recording, start_recording

SPIN = r"""
extern "C" __global__ void wait_flag(const volatile int* flag, long long cycles) {
    long long t0 = clock64();
    while (*flag == 0 && clock64() - t0 < cycles) { }
}
"""


class NvmlSampler:
    """Once a second: the device's clock-event reasons, clocks, power, temperature, and (with
    ``per_process``) each process's utilisation samples and memory; ``phase`` as the recorder's."""

    def __init__(self, per_process: bool) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.per_process = per_process
        self.phase = "warmup"
        self.rows: list[dict] = []
        self.stop = threading.Event()
        self.last_ts = 0
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.xids: list[dict] = []

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(self.h, *args)
        except self.nvml.NVMLError as exc:
            return f"error:{exc}"

    def counters(self) -> dict:
        """ECC and row-remap counters: what a sick GPU shows (read at start and end)."""
        n = self.nvml
        out: dict = {}
        for name, fn, args in (
            (
                "ecc_volatile_uncorrected",
                n.nvmlDeviceGetTotalEccErrors,
                (n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
            ),
            (
                "ecc_volatile_corrected",
                n.nvmlDeviceGetTotalEccErrors,
                (n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
            ),
            (
                "ecc_aggregate_uncorrected",
                n.nvmlDeviceGetTotalEccErrors,
                (n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC),
            ),
            ("remapped_rows", n.nvmlDeviceGetRemappedRows, ()),
            ("power_limit_mw", n.nvmlDeviceGetEnforcedPowerLimit, ()),
            ("max_sm_clock_mhz", n.nvmlDeviceGetMaxClockInfo, (n.NVML_CLOCK_SM,)),
        ):
            v = self._call(fn, *args)
            out[name] = list(v) if isinstance(v, tuple) else v
        return out

    def loop(self) -> None:
        n = self.nvml
        reasons = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        while not self.stop.wait(1.0):
            t, phase = round(time.time(), 3), self.phase
            row = {
                "t": t,
                "phase": phase,
                "pid": "",
                "clocks_event_reasons": self._call(reasons),
                "sm_clock_mhz": self._call(n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_SM),
                "power_w": (lambda v: round(v / 1000, 1) if isinstance(v, int) else v)(
                    self._call(n.nvmlDeviceGetPowerUsage)
                ),
                "temp_c": self._call(n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU),
            }
            self.rows.append(row)
            if not self.per_process:
                continue
            mem = self._call(n.nvmlDeviceGetComputeRunningProcesses)
            used = {p.pid: p.usedGpuMemory for p in mem} if isinstance(mem, list) else {}
            samples = self._call(n.nvmlDeviceGetProcessUtilization, self.last_ts)
            by_pid: dict[int, list] = {}
            if isinstance(samples, list):
                for s in samples:
                    by_pid.setdefault(s.pid, []).append(s)
                    self.last_ts = max(self.last_ts, s.timeStamp)
            for pid in sorted(set(used) | set(by_pid)):
                ss = by_pid.get(pid, [])
                self.rows.append(
                    {
                        "t": t,
                        "phase": phase,
                        "pid": pid,
                        "proc_sm_util_pct": round(sum(s.smUtil for s in ss) / len(ss), 1) if ss else "",
                        "proc_mem_util_pct": round(sum(s.memUtil for s in ss) / len(ss), 1) if ss else "",
                        "proc_samples": len(ss),
                        "proc_used_mib": round((used.get(pid) or 0) / 2**20, 1),
                    }
                )

    def write(self, path: Path) -> None:
        cols = ["t", "phase", "pid", "clocks_event_reasons", "sm_clock_mhz", "power_w", "temp_c",
                "proc_sm_util_pct", "proc_mem_util_pct", "proc_samples", "proc_used_mib"]  # fmt: skip
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            w.writerows(self.rows)


def watch_xids(sampler: NvmlSampler) -> None:
    """Count Xid events (NVML event set) while the recording runs: none expected on a healthy GPU."""
    n = sampler.nvml
    try:
        es = n.nvmlEventSetCreate()
        n.nvmlDeviceRegisterEvents(sampler.h, n.nvmlEventTypeXidCriticalError, es)
    except n.NVMLError as exc:
        sampler.xids.append({"error": str(exc)})
        return
    while not sampler.stop.is_set():
        try:
            e = n.nvmlEventSetWait_v2(es, 1000)
            sampler.xids.append({"t": round(time.time(), 3), "xid": int(e.eventData)})
        except n.NVMLError:
            continue


def run_hang(rec: Any, side: NvmlSampler, seconds: float) -> dict:
    import cupy as cp
    import torch

    res: dict = {}
    spin = cp.RawKernel(SPIN, "wait_flag")
    flag = cp.zeros(1, dtype=cp.int32)
    hz = cp.cuda.runtime.getDeviceProperties(0)["clockRate"] * 1000.0  # kHz → Hz: the clock64 budget
    held = torch.empty(int(20 * 2**30), dtype=torch.uint8, device="cuda")  # 20 GiB held, as a job's model and optimizer
    for phase, fn in (("idle_memory_held", None), *((f"hung_spin_{b}sm", b) for b in (2, 8, 32))):
        rec.phase = side.phase = phase
        t0 = time.perf_counter()
        if fn is None:
            time.sleep(seconds)
        else:
            spin((fn,), (32,), (flag, cp.int64(int(seconds * hz))))
            cp.cuda.Device(0).synchronize()
        res[phase] = {"wall_s": round(time.perf_counter() - t0, 2), "blocks": fn or 0, "sms": 132}
        log(f"{phase}: {res[phase]}")
        rec.phase = side.phase = "gap"
        time.sleep(3.0)
    del held
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    rec.phase = side.phase = "bf16_matmul_full_power"
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            a @ a
        n += 8
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    res["bf16_matmul_full_power"] = {"wall_s": round(wall, 2), "tflops": round(2 * 8192**3 * n / wall / 1e12, 1)}
    rec.phase = side.phase = "gap"
    return res


# -- sharing --------------------------------------------------------------------------------------
def worker(role: str, seconds: float, q: Any, go: Any) -> None:
    """One process of a mix: warm up, wait for ``go``, run ``role`` for ``seconds``, report steps/s."""
    import torch

    torch.cuda.set_device(0)
    if role == "train":
        a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")

        def step() -> None:
            a @ a
    elif role == "infer":
        w1 = torch.randn(2048, 8192, dtype=torch.bfloat16, device="cuda")
        w2 = torch.randn(8192, 2048, dtype=torch.bfloat16, device="cuda")
        x = torch.randn(8, 2048, dtype=torch.bfloat16, device="cuda")

        def step() -> None:
            torch.relu(x @ w1) @ w2
    else:  # idle: holds memory, runs nothing
        held = torch.empty(int(8 * 2**30), dtype=torch.uint8, device="cuda")

        def step() -> None:
            time.sleep(0.1)

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    q.put(("ready", role, os.getpid()))
    go.wait()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
        if n % 16 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    q.put(("done", role, os.getpid(), n, round(n / wall, 2)))
    if role == "idle":
        del held


def run_mix(rec: Any, side: NvmlSampler, name: str, roles: list[str], seconds: float) -> dict:
    ctx = mp.get_context("spawn")
    q, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=worker, args=(r, seconds, q, go)) for r in roles]
    for p in procs:
        p.start()
    pids: dict[int, str] = {}
    for _ in procs:
        _ready, role, pid = q.get(timeout=300)
        pids[pid] = role
    rec.phase = side.phase = name
    go.set()
    out = []
    for _ in procs:
        _done, role, pid, n, rate = q.get(timeout=seconds + 120)
        out.append({"role": role, "pid": pid, "steps": n, "steps_per_s": rate})
    rec.phase = side.phase = "gap"
    for p in procs:
        p.join(30)
    log(f"{name}: {out}")
    time.sleep(3.0)
    return {"processes": sorted(out, key=lambda o: o["pid"])}


def run_share(rec: Any, side: NvmlSampler, seconds: float) -> dict:
    mixes = {
        "alone_train": ["train"],
        "alone_infer": ["infer"],
        "alone_idle": ["idle"],
        "train_infer": ["train", "infer"],
        "train_train": ["train", "train"],
        "train_idle": ["train", "idle"],
        "train_infer_idle": ["train", "infer", "idle"],
    }
    return {name: run_mix(rec, side, name, roles, seconds) for name, roles in mixes.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--group", choices=["hang", "share"], required=True)
    ap.add_argument("--seconds", type=float, default=25.0)
    args = ap.parse_args()
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    agent, rec = start_recording()
    side = NvmlSampler(per_process=args.group == "share")
    side.t.start()
    threading.Thread(target=watch_xids, args=(side,), daemon=True).start()
    before = side.counters()
    res: dict = {}
    name = f"h200-{args.group}"
    try:
        res = (run_hang if args.group == "hang" else run_share)(rec, side, args.seconds)
    finally:
        side.stop.set()
        side.t.join(5)
        side.write(Path(os.environ.get("OUT", ".")) / f"{name}.nvml.csv")
        truth = {
            "workloads": res,
            "counters_before": before,
            "counters_after": side.counters(),
            "xid_events": side.xids,
        }
        finish_recording(rec, agent, name, truth)
    return 0


if __name__ == "__main__":
    sys.exit(main())
