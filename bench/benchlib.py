"""Shared pieces of the benchmarks: the TSDB block generator and a private Prometheus.

History at benchmark scale is written straight into TSDB blocks by ``bench/tsdbgen`` (Prometheus's
own TSDB package from the Go module proxy); OpenMetrics text through promtool would be gigabytes.
The generator is built once per machine and cached by a hash of its source, so an edited
generator is rebuilt instead of a stale binary being reused.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("GPU_AUDITOR_CACHE", Path.home() / ".cache" / "gpu-auditor"))
TSDBGEN_SRC = REPO / "bench" / "tsdbgen"


def log(msg: str) -> None:
    print(f"[bench {datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def tsdbgen() -> Path:
    """Build (once per source version) and return the block generator."""
    digest = hashlib.sha1()
    for name in ("main.go", "go.mod", "go.sum"):
        digest.update((TSDBGEN_SRC / name).read_bytes())
    binary = CACHE / "bin" / f"tsdbgen-{digest.hexdigest()[:12]}"
    if not binary.exists():
        log("building bench/tsdbgen (once per machine and source version)")
        binary.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["go", "build", "-o", str(binary), "."],
            cwd=TSDBGEN_SRC,
            env={**os.environ, "GOFLAGS": "-mod=mod"},
            check=True,
        )
    return binary


def write_history(
    out: Path,
    *,
    jobs: int,
    pods_per_job: int = 1,
    gpus: int,
    end: int,
    seconds: int,
    interval: int,
    namespace: str,
    namespaces: int = 0,
) -> None:
    """Write one block of synthetic dcgm-exporter history (pods ``job-NNNNN-P``) into ``out``."""
    subprocess.run(
        [
            str(tsdbgen()),
            f"-out={out}",
            f"-jobs={jobs}",
            f"-pods-per-job={pods_per_job}",
            f"-gpus={gpus}",
            f"-end={end}",
            f"-duration={seconds}s",
            f"-interval={interval}s",
            f"-namespace={namespace}",
            f"-namespaces={namespaces}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query_requests(url: str) -> int:
    """Queries a Prometheus has served, from its own ``/metrics`` (it need not scrape itself)."""
    text = requests.get(f"{url}/metrics", timeout=30).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("prometheus_http_requests_total{") and (
            'handler="/api/v1/query"' in line or 'handler="/api/v1/query_range"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def prometheus_cpu(url: str) -> float:
    """CPU seconds the Prometheus process has used (its own ``process_cpu_seconds_total``)."""
    for line in requests.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("process_cpu_seconds_total "):
            return float(line.split()[1])
    return 0.0


class PrivatePrometheus:
    """A Prometheus on a data dir of its own (the test bed's Debian binary), never disturbing the test bed."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = data_dir.parent / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
        self.log = open(data_dir.parent / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [
                shutil.which("prometheus") or "/usr/bin/prometheus",
                f"--config.file={cfg}",
                f"--storage.tsdb.path={data_dir}",
                "--storage.tsdb.retention.time=30d",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--query.max-samples=200000000",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.url}/-/ready", timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited; see {self.log.name}")
            time.sleep(0.5)
        raise RuntimeError(f"prometheus not ready after 120 s; see {self.log.name}")

    def query_requests(self) -> int:
        return query_requests(self.url)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
