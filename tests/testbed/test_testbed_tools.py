"""helm, kubectl and promtool are the pinned real binaries, and the env file matches the fixture."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from auditor.testbed import config

pytestmark = pytest.mark.testbed


def _run(*argv: str) -> str:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout + out.stderr


def test_helm_version(testbed):
    assert f'Version:"v{config.HELM_VERSION}"' in _run(testbed.helm, "version")


def test_kubectl_reaches_the_server(testbed):
    out = _run(testbed.kubectl, f"--kubeconfig={testbed.kubeconfig}", "version")
    assert f"Client Version: v{config.K8S_VERSION}" in out
    assert f"Server Version: v{config.K8S_VERSION}" in out


def test_promtool_runs(testbed):
    assert "promtool" in _run(testbed.promtool, "--version")


def test_env_file_is_shell_sourceable(testbed):
    env_file = Path(testbed.state_dir) / "env"
    script = f'. {shlex.quote(str(env_file))} && echo "$KUBECONFIG|$PROMETHEUS_URL|$DATABASE_URL|$HELM"'
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.strip()
    assert out == f"{testbed.kubeconfig}|{testbed.prometheus_url}|{testbed.database_url}|{testbed.helm}"
