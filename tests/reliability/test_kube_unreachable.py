"""An API server that cannot be reached is one clear line naming it, never a traceback.

The probe: ``audit --kubeconfig`` and ``doctor --kubeconfig`` with the API server down printed
urllib3's 40-line ``MaxRetryError`` traceback. Every request of the Kubernetes client now maps
a connection failure to our retryable error naming the server (auditor/kube/client.py), and
``audit`` makes one request before any watch starts. The kubeconfig is the bed's real one
(credentials, CA) with the server moved to a closed port.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

CLI = str(Path(sys.executable).with_name("gpu-auditor"))


@pytest.fixture
def closed_kubeconfig(testbed, tmp_path: Path) -> tuple[Path, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    text = Path(testbed.kubeconfig).read_text()
    server = f"https://127.0.0.1:{port}"
    moved, n = re.subn(r"server: https://[^\s]+", f"server: {server}", text)
    assert n >= 1
    path = tmp_path / "kubeconfig"
    path.write_text(moved)
    return path, server


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)


def test_audit_with_the_api_server_down_is_one_line(closed_kubeconfig, prometheus, tmp_path: Path) -> None:
    kubeconfig, server = closed_kubeconfig
    r = cli(
        "audit",
        "--kubeconfig",
        str(kubeconfig),
        "--prometheus",
        prometheus.url,
        "--start",
        "2026-11-30T09:00:00Z",
        "--end",
        "2026-11-30T10:00:00Z",
        "--db",
        f"sqlite:///{tmp_path}/a.db",
    )
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"gpu-auditor: failed (retryable): Kubernetes API at {server}: unreachable: Connection refused"
    ]


def test_doctor_reports_the_api_server_down_as_a_failed_check(closed_kubeconfig, prometheus) -> None:
    kubeconfig, server = closed_kubeconfig
    r = cli("doctor", "--kubeconfig", str(kubeconfig), "--prometheus", prometheus.url)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr + r.stdout
    assert f"[FAIL] Kubernetes API reachable: Kubernetes API at {server}: unreachable: Connection refused" in r.stdout
    assert "Prometheus reachable" in r.stdout  # the rest of the checklist is still there


def test_run_once_with_the_api_server_down_is_one_line(closed_kubeconfig, prometheus, tmp_path: Path) -> None:
    kubeconfig, server = closed_kubeconfig
    r = cli(
        "run",
        "--once",
        "--kubeconfig",
        str(kubeconfig),
        "--prometheus",
        prometheus.url,
        "--db",
        f"sqlite:///{tmp_path}/a.db",
    )
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"gpu-auditor: failed (retryable): Kubernetes API at {server}: unreachable: Connection refused"
    ]
