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
import re
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


def _label(name: str) -> str:
    """A Kubernetes label name as Prometheus's discovery spells it in a meta label (SanitizeLabelName)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def endpointslice_targets(kubectl: Path, kubeconfig: Path, namespaces: list[str]) -> list[dict[str, Any]]:
    """Targets as Prometheus's Kubernetes discovery (role ``endpointslice``) derives them from the
    EndpointSlices and Services in ``namespaces``: one per ready address and port, with the meta
    labels the operator's relabelings read (``file_sd`` format).

    Needed because the Debian package's Prometheus is built without Kubernetes discovery (its
    configuration parser refuses ``kubernetes_sd_configs``); the objects are still the apiserver's.
    """
    out: list[dict[str, Any]] = []
    for ns in namespaces:
        services = {
            svc["metadata"]["name"]: svc
            for svc in (_kubectl_json(kubectl, kubeconfig, "services", "-n", ns) or {}).get("items", [])
        }
        for eps in (_kubectl_json(kubectl, kubeconfig, "endpointslices", "-n", ns) or {}).get("items", []):
            svc_name = (eps["metadata"].get("labels") or {}).get("kubernetes.io/service-name", "")
            base = {
                "__meta_kubernetes_namespace": ns,
                "__meta_kubernetes_endpointslice_name": eps["metadata"]["name"],
                "__meta_kubernetes_endpointslice_address_type": eps.get("addressType", ""),
            }
            svc = services.get(svc_name)
            if svc is not None:
                base["__meta_kubernetes_service_name"] = svc_name
                for k, v in (svc["metadata"].get("labels") or {}).items():
                    base[f"__meta_kubernetes_service_label_{_label(k)}"] = v
                    base[f"__meta_kubernetes_service_labelpresent_{_label(k)}"] = "true"
            for ep in eps.get("endpoints") or []:
                ready = str((ep.get("conditions") or {}).get("ready", True)).lower()
                ref = ep.get("targetRef") or {}
                for port in eps.get("ports") or []:
                    labels = dict(base)
                    labels.update(
                        {
                            "__meta_kubernetes_endpointslice_port_name": port.get("name", ""),
                            "__meta_kubernetes_endpointslice_port": str(port.get("port", "")),
                            "__meta_kubernetes_endpointslice_port_protocol": port.get("protocol", "TCP"),
                            "__meta_kubernetes_endpointslice_endpoint_conditions_ready": ready,
                        }
                    )
                    if ref:
                        labels["__meta_kubernetes_endpointslice_address_target_kind"] = ref.get("kind", "")
                        labels["__meta_kubernetes_endpointslice_address_target_name"] = ref.get("name", "")
                    out.extend(
                        {"targets": [f"{addr}:{port.get('port')}"], "labels": labels} for addr in ep["addresses"]
                    )
    return out


def localize_config(text: str, prometheus: str, kubectl: Path, kubeconfig: Path, directory: Path) -> str:
    """The operator's configuration made runnable by the Debian package's Prometheus on this host.

    Three substitutions, each because the configuration is written for a pod of the operator's
    StatefulSet: ``$(POD_NAME)`` and ``$(SHARD)`` are expanded as the operator's config-reloader
    does from the pod's environment (pod ``prometheus-<name>-0``, shard 0); ``rule_files`` (the
    pod's mount of the rule ConfigMaps) become ``directory/rules/*.yaml``, where the caller writes
    them; and each job's ``kubernetes_sd_configs`` becomes a ``file_sd_configs`` file holding what
    Kubernetes discovery would give from the apiserver's EndpointSlices and Services
    (:func:`endpointslice_targets`). Job names, relabelings, intervals and rules stay the operator's.
    """
    text = text.replace("$(POD_NAME)", f"prometheus-{prometheus}-0").replace("$(SHARD)", "0")
    doc: dict[str, Any] = yaml.safe_load(text)
    for i, job in enumerate(doc.get("scrape_configs") or []):
        sds = job.pop("kubernetes_sd_configs", None)
        if not sds:
            continue
        if any(sd.get("role") != "endpointslice" for sd in sds):
            raise TestbedError(
                "prometheus-operator configuration", f"{job['job_name']}: only role endpointslice is emulated"
            )
        targets = [
            t
            for sd in sds
            for t in endpointslice_targets(kubectl, kubeconfig, list((sd.get("namespaces") or {}).get("names") or []))
        ]
        sd_file = directory / f"sd-{i}.json"
        sd_file.write_text(json.dumps(targets, indent=1))
        job["file_sd_configs"] = [{"files": [str(sd_file)]}]
    doc["rule_files"] = [str(directory / "rules" / "*.yaml")]
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
