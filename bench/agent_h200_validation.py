"""Validate the node agent on a real GPU (an H200): does what it serves match known workloads?

Starts ``python -m auditor.agent`` (``--source auto``: GPM on Hopper when DCGM is absent) as its
own process, runs three known workloads one after another on GPU 0 for ~20 s each, scrapes the
agent's ``/metrics`` during each (every 5 s after a 4 s ramp-up, each scrape = the mean of the 1 s
samples since the previous one) and checks:

- one thread block spinning (CuPy RawKernel) → gpu_util >= 0.95 and sm_active <= 0.02
- bf16 matrix products (torch, 8192²)      → tensor_active >= 0.5
- device-to-device copies (torch, 2 GiB)    → dram_active >= 0.5 and tensor_active < 0.05

plus: an idle baseline; pod attribution of the real GPU through a pod-resources gRPC server on a
unix socket (our own message definitions; skipped when protobuf is not installed); a second agent
with ``--source nvml`` serving no profiling series at all (absent, never 0); and the agent's own
cost per GPU per sample (CPU time of its sampling thread / samples / GPUs, from its self-metrics).

Needs: an NVIDIA GPU (GPM needs Hopper+), torch, cupy, nvidia-ml-py, prometheus-client, grpcio;
the repository on PYTHONPATH; no network. The audit's other dependencies (sqlmodel, kubernetes…)
are not needed and not imported. Writes ``$OUT/agent_validation.json`` when ``OUT`` is set
(else ``./agent_validation.json``); exit 0 when every check passes, 1 otherwise. ~90 s.

    PYTHONPATH=$PWD python3 bench/agent_h200_validation.py
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA index == NVML index

REPO = Path(__file__).resolve().parents[1]
PHASE_SECONDS = 20.0
RAMP_SECONDS = 4.0
SCRAPE_EVERY = 5.0
NAMES = {
    "gpu_util": "DCGM_FI_DEV_GPU_UTIL",
    "sm_active": "DCGM_FI_PROF_SM_ACTIVE",
    "sm_occupancy": "DCGM_FI_PROF_SM_OCCUPANCY",
    "tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "gr_engine_active": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "fp32_active": "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "power_w": "DCGM_FI_DEV_POWER_USAGE",
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sh(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        return f"ERR {exc}"


# -- the agent ---------------------------------------------------------------------------------
class AgentProcess:
    def __init__(self, *args: str) -> None:
        self.port = free_port()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        self.log = tempfile.NamedTemporaryFile(prefix="agent-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "auditor.agent",
                "-v",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--node-name",
                "validation",
                *args,
            ],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited {self.proc.returncode}: {self.output()}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"agent not healthy within 60 s: {self.output()}")

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def scrape(self, scraper: str) -> list[tuple[str, dict, float]]:
        from prometheus_client.parser import text_string_to_metric_families

        req = urllib.request.Request(f"{self.url}/metrics", headers={"User-Agent": scraper})
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read().decode()
        return [(s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def gpu_values(series: list[tuple[str, dict, float]], uuid: str) -> dict:
    out: dict = {}
    for key, name in NAMES.items():
        for n, labels, v in series:
            if n == name and labels.get("UUID") == uuid and not labels.get("GPU_I_ID"):
                out[key] = v / 100.0 if key == "gpu_util" else v
    return out


def self_metric(series: list[tuple[str, dict, float]], name: str) -> float | None:
    for n, _, v in series:
        if n == name:
            return v
    return None


# -- workloads ---------------------------------------------------------------------------------
def make_workloads() -> list[tuple[str, object]]:
    import cupy as cp
    import torch

    torch.cuda.set_device(0)
    cp.cuda.Device(0).use()
    spin = cp.RawKernel(
        r"""
    extern "C" __global__ void spin(float* out, long long cycles) {
        long long start = clock64(); float x = threadIdx.x;
        while (clock64() - start < cycles) { x = x * 1.0000001f + 0.5f; }
        out[threadIdx.x] = x;
    }""",
        "spin",
    )
    out = cp.zeros(1024, dtype=cp.float32)

    def one_block() -> None:  # one thread block on one SM, ~0.25 s per launch
        spin((1,), (128,), (out, cp.int64(500_000_000)))
        cp.cuda.Device().synchronize()

    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def matmul() -> None:
        for _ in range(20):
            torch.mm(x, y)
        torch.cuda.synchronize()

    a = torch.randn(1 << 29, device="cuda", dtype=torch.float32)  # 2 GiB
    b = torch.empty_like(a)

    def copy() -> None:
        for _ in range(20):
            b.copy_(a)
        torch.cuda.synchronize()

    return [("one_block_spin", one_block), ("bf16_matmul", matmul), ("d2d_copy", copy)]


def run_phase(agent: AgentProcess, name: str, fn, uuid: str) -> dict:
    stop = threading.Event()
    errors: list[str] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                fn()
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    scraper = f"validation-{name}"
    t = threading.Thread(target=loop, daemon=True) if fn else None
    if t:
        t.start()
    time.sleep(RAMP_SECONDS)
    agent.scrape(scraper)  # start this scraper's window after the ramp-up
    scrapes = []
    t_end = time.time() + PHASE_SECONDS - RAMP_SECONDS
    while time.time() + SCRAPE_EVERY <= t_end + 0.5:
        time.sleep(SCRAPE_EVERY)
        series = agent.scrape(scraper)
        vals = gpu_values(series, uuid)
        vals["samples"] = self_metric(series, "gpu_auditor_agent_window_samples")
        scrapes.append(vals)
    stop.set()
    if t:
        t.join(timeout=10)
    mean: dict = {}
    for key in NAMES:
        pairs = [(s[key], s["samples"] or 1) for s in scrapes if key in s]
        if pairs:
            mean[key] = round(sum(v * w for v, w in pairs) / sum(w for _, w in pairs), 4)
    log(f"{name}: {mean}")
    return {"mean": mean, "scrapes": scrapes, "errors": errors}


# -- pod attribution -----------------------------------------------------------------------------
def start_pod_resources(uuid: str):
    """A pod-resources server (our message definitions) saying pod bench/validation-pod holds GPU 0."""
    from concurrent import futures

    import grpc

    from auditor.agent.podresources import LIST_METHOD, messages

    request_cls, response_cls = messages()
    resp = response_cls()
    pod = resp.pod_resources.add(name="validation-pod", namespace="bench")
    c = pod.containers.add(name="main")
    c.devices.add(resource_name="nvidia.com/gpu", device_ids=[uuid])
    service, method = LIST_METHOD.strip("/").split("/")
    handler = grpc.method_handlers_generic_handler(
        service,
        {
            method: grpc.unary_unary_rpc_method_handler(
                lambda req, ctx: resp,
                request_deserializer=request_cls.FromString,
                response_serializer=response_cls.SerializeToString,
            )
        },
    )
    d = tempfile.mkdtemp(prefix="podres-", dir="/tmp")
    path = os.path.join(d, "kubelet.sock")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=(handler,))
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server, path, d


def main() -> int:
    t_start = time.time()
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    uuid = pynvml.nvmlDeviceGetUUID(h)
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    name = pynvml.nvmlDeviceGetName(h)
    name = name.decode() if isinstance(name, bytes) else name
    driver = pynvml.nvmlSystemGetDriverVersion()
    driver = driver.decode() if isinstance(driver, bytes) else driver
    n_gpus = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    result: dict = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gpu": name,
        "gpu_count": n_gpus,
        "gpu0_uuid": uuid,
        "driver": driver,
        "nvidia_smi": sh(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm", "--format=csv,noheader"])
        if shutil.which("nvidia-smi")
        else None,
        "python": platform.python_version(),
        "nvidia_ml_py": _version("nvidia-ml-py"),
        "prometheus_client": _version("prometheus-client"),
        "grpcio": _version("grpcio"),
        "protobuf": _version("protobuf"),
        "phases": {},
        "checks": {},
        "notes": [],
    }
    log(f"{name} x{n_gpus}, driver {driver}")

    pod_server = None
    pod_args = ["--pod-resources-socket", ""]
    try:
        pod_server, sock, sock_dir = start_pod_resources(uuid)
        pod_args = ["--pod-resources-socket", sock, "--refresh", "2s"]
    except ImportError as exc:
        result["notes"].append(f"pod attribution not exercised: {exc}")

    agent = AgentProcess("--source", "auto", "--interval", "1s", *pod_args)
    try:
        first = agent.scrape("validation-info")
        info = [labels for n, labels, _ in first if n == "gpu_auditor_agent_info"]
        result["agent_backend"] = info[0].get("backend") if info else None
        log(f"agent up, backend {result['agent_backend']}")

        # the plain-NVML fallback, for a few seconds during the idle baseline: profiling series absent
        fallback = AgentProcess("--source", "nvml", "--interval", "1s", "--pod-resources-socket", "")
        try:
            time.sleep(3)
            fs = fallback.scrape("validation-fallback")
            result["checks"]["nvml_fallback_serves_no_profiling_series"] = not any(
                n.startswith("DCGM_FI_PROF_") for n, _, _ in fs
            ) and any(n == "DCGM_FI_DEV_GPU_UTIL" for n, _, _ in fs)
        finally:
            fallback.stop()

        result["phases"]["idle"] = run_phase(agent, "idle", None, uuid)
        for phase, fn in make_workloads():
            result["phases"][phase] = run_phase(agent, phase, fn, uuid)

        series = agent.scrape("validation-info")
        cpu = self_metric(series, "gpu_auditor_agent_sample_cpu_seconds_total")
        samples = self_metric(series, "gpu_auditor_agent_samples_total")
        devices = self_metric(series, "gpu_auditor_agent_devices")
        if cpu is not None and samples and devices:
            result["cost"] = {
                "samples": samples,
                "devices": devices,
                "sampling_cpu_seconds": round(cpu, 4),
                "cpu_ms_per_gpu_per_sample": round(1000.0 * cpu / samples / devices, 4),
                "agent_process_cpu_seconds": _proc_cpu(agent.proc.pid),
                "agent_rss_mib": _rss_mib(agent.proc.pid),
            }
        pods = {
            labels.get("pod") for n, labels, _ in series if n == "DCGM_FI_DEV_GPU_UTIL" and labels.get("UUID") == uuid
        }
        if pod_server is not None:
            result["checks"]["gpu0_attributed_to_pod"] = pods == {"validation-pod"}
        result["example_series"] = sorted(
            f"{n}{{{','.join(f'{k}={v!r}' for k, v in sorted(lab.items()))}}} {v}"
            for n, lab, v in series
            if n in (NAMES["sm_active"], NAMES["gpu_util"]) and lab.get("UUID") == uuid
        )
        result["checks"]["all_series_carry_source_label"] = all(
            labels.get("source") == "gpu-auditor-agent" for n, labels, _ in series if n.startswith("DCGM_FI_")
        )
    finally:
        agent.stop()
        result["agent_log_tail"] = agent.output()[-1500:]
        if pod_server is not None:
            pod_server.stop(None)
            shutil.rmtree(sock_dir, ignore_errors=True)

    p = {k: v["mean"] for k, v in result["phases"].items()}
    spin, mm, cp_ = p.get("one_block_spin", {}), p.get("bf16_matmul", {}), p.get("d2d_copy", {})
    result["checks"].update(
        {
            "one_block: gpu_util >= 0.95": spin.get("gpu_util", 0) >= 0.95,
            "one_block: sm_active <= 0.02": spin.get("sm_active", 1) <= 0.02,
            "matmul: tensor_active >= 0.5": mm.get("tensor_active", 0) >= 0.5,
            "copy: dram_active >= 0.5": cp_.get("dram_active", 0) >= 0.5,
            "copy: tensor_active < 0.05": cp_.get("tensor_active", 1) < 0.05,
            "backend is gpm or dcgm": result.get("agent_backend") in ("gpm", "dcgm"),
        }
    )
    result["passed"] = all(result["checks"].values())
    result["seconds"] = round(time.time() - t_start, 1)
    out_dir = Path(os.environ.get("OUT") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "agent_validation.json").write_text(json.dumps(result, indent=2, default=str))
    print(
        json.dumps(
            {k: result[k] for k in ("gpu", "driver", "agent_backend", "checks", "passed") if k in result}, indent=2
        )
    )
    print(json.dumps({k: v["mean"] for k, v in result["phases"].items()}, indent=2))
    print(json.dumps(result.get("cost"), indent=2))
    log(f"wrote {out_dir / 'agent_validation.json'}; {'PASS' if result['passed'] else 'FAIL'}")
    return 0 if result["passed"] else 1


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _proc_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 3)
    except OSError:
        return None


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


if __name__ == "__main__":
    sys.exit(main())
