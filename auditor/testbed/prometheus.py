"""A real Prometheus (the Debian package) with its own configuration and data directory.

It scrapes nothing: tests put history in with the backfill helper (``auditor.testbed.backfill``).
The admin API and the lifecycle endpoints are on, so tests may delete series or reload config.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import requests

from auditor.testbed import process
from auditor.testbed.binaries import Binaries
from auditor.testbed.launch import launch
from auditor.testbed.state import State

CONFIG = """\
# gpu-auditor test bed: no scrape targets; history comes from backfilled blocks.
global:
  scrape_interval: 15s
  evaluation_interval: 15s
scrape_configs: []
"""

#: Long retention: tests backfill history placed days or weeks in the past.
RETENTION = "10y"


def argv(bins: Binaries, directory: Path, port: int) -> list[str]:
    return [
        str(bins.prometheus),
        f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--storage.tsdb.retention.time={RETENTION}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-admin-api",
        "--web.enable-lifecycle",
        "--log.level=warn",
    ]


def ready_probe(port: int) -> Callable[[], bool]:
    return lambda: process.local_get(f"http://127.0.0.1:{port}/-/ready", timeout=2).status_code == 200


def start(state: State, bins: Binaries, fixed_port: int | None = None) -> str:
    directory = state.dir / "prometheus"
    (directory / "data").mkdir(parents=True, exist_ok=True)
    (directory / "prometheus.yml").write_text(CONFIG)

    def make_argv(p: dict[str, int]) -> Sequence[str]:
        return argv(bins, directory, p["web"])

    proc, secs = launch(
        state,
        "prometheus",
        make_argv,
        lambda p: ready_probe(p["web"]),
        ports=("web",),
        fixed_ports={"web": fixed_port} if fixed_port else None,
        marker=str(directory / "data"),
        timeout=60,
    )
    url = f"http://127.0.0.1:{proc.ports['web']}"
    state.set(prometheus_url=url, prometheus_data_dir=str(directory / "data"))
    print(f"testbed: prometheus ready at {url} ({secs:.1f} s)", file=sys.stderr, flush=True)
    return url


def healthy(state: State, grace: float = 5.0) -> bool:
    """Whether it answers ``/-/ready``, allowing ``grace`` seconds for a backfill's restart
    (another session may be restarting it right now; that takes well under a second)."""
    url = state.values.get("prometheus_url")
    if not url:
        return False
    deadline = time.monotonic() + grace
    while True:
        try:
            return process.local_get(f"{url}/-/ready", timeout=3).status_code == 200
        except requests.RequestException:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.25)
