"""The real Prometheus Operator, built from the Go module proxy, run against the test bed's apiserver.

kube-prometheus-stack's Prometheus is a ``Prometheus`` object that the Prometheus Operator turns
into a configuration (Secret ``prometheus-<name>``, key ``prometheus.yaml.gz``) and rule files
(ConfigMaps ``prometheus-<name>-rulefiles-<i>``): names from the operator's own code
(pkg/prometheus/common.go ``ConfigSecretName``/``ConfigFilename``, pkg/operator/rules.go
``configMapNameAt``). Whether our chart's ServiceMonitors and PrometheusRule are selected is decided
there, so a test reads those objects instead of trusting our reading of the selectors.

The binary is built once (``go get -tool`` + ``go build`` of ``cmd/operator``) and cached by version
under the bed's cache, like the bed's own binaries; the CRDs come from the same module's
``example/prometheus-operator-crd``. The StatefulSet the operator creates never runs here (no
images): only the objects it writes are used.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from auditor.testbed import config, process
from auditor.testbed.binaries import file_lock, module_files
from auditor.testbed.errors import TestbedError

MODULE = "github.com/prometheus-operator/prometheus-operator"
#: served by the Go module proxy (v0.90.0 is refused there); kube-prometheus-stack 88.x ships v0.93
VERSION = "v0.91.0"
CRD_FILES = tuple(
    f"monitoring.coreos.com_{kind}.yaml"
    for kind in (
        "alertmanagerconfigs",
        "alertmanagers",
        "podmonitors",
        "probes",
        "prometheusagents",
        "prometheuses",
        "prometheusrules",
        "scrapeconfigs",
        "servicemonitors",
        "thanosrulers",
    )
)
CRDS = config.CrdSource(MODULE, VERSION, "example/prometheus-operator-crd", CRD_FILES)


def binary_path() -> Path:
    return config.cache_dir() / "bin" / f"prometheus-operator-{VERSION}" / "operator"


def build(log: Path) -> tuple[Path, float]:
    """The operator binary, built if missing; returns it and the seconds the build took (0 when cached).

    A cold build downloads ~100 modules and compiles them: minutes on a small machine. Its output
    goes to ``log`` so a failure can be read.
    """
    target = binary_path()
    if os.access(target, os.X_OK):
        return target, 0.0
    with file_lock(config.cache_dir() / "build.lock"):
        if os.access(target, os.X_OK):
            return target, 0.0
        if shutil.which("go") is None:
            raise TestbedError("prometheus-operator", "'go' not found on PATH (needed once to build it)")
        t0 = time.monotonic()
        target.parent.mkdir(parents=True, exist_ok=True)
        env = dict(
            os.environ,
            GOTOOLCHAIN=os.environ.get("GOTOOLCHAIN", "local"),
            CGO_ENABLED="0",
            GOFLAGS="-mod=mod -modcacherw",
        )
        pkg = f"{MODULE}/cmd/operator"
        log.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as work, open(log, "ab") as out:
            for argv in (
                ["go", "mod", "init", "local.test/prometheus-operator-testbin"],
                ["go", "get", "-tool", f"{pkg}@{VERSION}"],
                ["go", "build", "-p", "2", "-trimpath", "-ldflags=-s -w", "-o", f"{target}.tmp", pkg],
            ):
                proc = subprocess.run(argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
                if proc.returncode != 0:
                    raise TestbedError("prometheus-operator build", f"{' '.join(argv)} exited {proc.returncode}", log)
        os.replace(f"{target}.tmp", target)
        return target, time.monotonic() - t0


def crd_files() -> list[Path]:
    """The operator's CRD manifests at :data:`VERSION`, copied from its module on first use."""
    return module_files(CRDS)


@dataclass
class Operator:
    """A running operator process (stop it with :meth:`stop`)."""

    pid: int
    log: Path
    port: int

    def stop(self) -> None:
        process.stop(self.pid, str(binary_path()))


def start(binary: Path, kubeconfig: Path, namespaces: list[str], log: Path, timeout: float = 60.0) -> Operator:
    """Run the operator on the host against ``kubeconfig``'s apiserver, watching only ``namespaces``.

    Scoped to the test's namespaces, so on a shared bed it never touches anyone else's objects.
    Ready when its web server answers ``/healthz``.
    """
    port = process.free_port()
    argv = [
        str(binary),
        f"--web.listen-address=127.0.0.1:{port}",
        f"--namespaces={','.join(namespaces)}",
        "--log-level=debug",
    ]
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    pid = process.start("prometheus-operator", argv, log, env=env)

    def up() -> bool:
        return process.local_get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200

    process.wait_ready("prometheus-operator", pid, up, log, timeout)
    return Operator(pid, log, port)


def _kubectl_json(kubectl: Path, kubeconfig: Path, *args: str) -> dict | None:
    proc = subprocess.run(
        [str(kubectl), "--kubeconfig", str(kubeconfig), "get", *args, "-o", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    doc: dict = json.loads(proc.stdout)
    return doc


def generated_config(kubectl: Path, kubeconfig: Path, namespace: str, prometheus: str) -> str | None:
    """The Prometheus configuration the operator generated for ``prometheus`` (None before it has)."""
    secret = _kubectl_json(kubectl, kubeconfig, "secret", f"prometheus-{prometheus}", "-n", namespace)
    data = (secret or {}).get("data", {}).get("prometheus.yaml.gz")
    return gzip.decompress(base64.b64decode(data)).decode() if data else None


def rule_files(kubectl: Path, kubeconfig: Path, namespace: str, prometheus: str) -> dict[str, str]:
    """The rule files the operator generated for ``prometheus``: file name → content, over all its
    ``prometheus-<name>-rulefiles-<i>`` ConfigMaps."""
    found = _kubectl_json(kubectl, kubeconfig, "configmaps", "-n", namespace) or {}
    prefix = f"prometheus-{prometheus}-rulefiles-"
    files: dict[str, str] = {}
    for cm in found.get("items", []):
        if cm["metadata"]["name"].startswith(prefix):
            files.update(cm.get("data") or {})
    return files


def localize_config(text: str, kubeconfig: Path, rules_dir: Path) -> str:
    """The operator's configuration made runnable by a Prometheus on this host, and nothing else changed.

    Two substitutions, because the configuration is written for a pod: its Kubernetes service
    discovery has no ``api_server`` (in-cluster credentials), so each ``kubernetes_sd_configs``
    entry gets ``kubeconfig_file`` (the bed's admin kubeconfig); and its ``rule_files`` name the
    pod's mount of the rule ConfigMaps, so they point at ``rules_dir`` where the test wrote them.
    Jobs, relabelings, selectors and intervals stay as the operator generated them.
    """
    doc: dict[str, Any] = yaml.safe_load(text)
    for job in doc.get("scrape_configs") or []:
        for sd in job.get("kubernetes_sd_configs") or []:
            sd["kubeconfig_file"] = str(kubeconfig)
    doc["rule_files"] = [str(rules_dir / "*.yaml")]
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass
class LocalPrometheus:
    """The Debian package's Prometheus run on a configuration (stop it with :meth:`stop`)."""

    pid: int
    url: str
    binary: Path

    def stop(self) -> None:
        process.stop(self.pid, str(self.binary))


def run_prometheus(binary: Path, config_file: Path, directory: Path, timeout: float = 60.0) -> LocalPrometheus:
    """Start ``binary`` on ``config_file`` with its own data directory; ready when ``/-/ready`` answers."""
    port = process.free_port()
    log = directory / "prometheus.log"
    argv = [
        str(binary),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=info",
    ]
    pid = process.start("prometheus (operator-generated configuration)", argv, log)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        return process.local_get(f"{url}/-/ready", timeout=2).status_code == 200

    process.wait_ready("prometheus (operator-generated configuration)", pid, up, log, timeout)
    return LocalPrometheus(pid, url, binary)
