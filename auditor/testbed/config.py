"""Pinned versions and where the test bed keeps things.

The versions here are the single source of truth: the build script receives them through its
environment, so the Python side always looks for the very binaries the script builds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from auditor.testbed.errors import TestbedError

K8S_VERSION = "1.36.3"
ETCD_VERSION = "3.6.16"
HELM_VERSION = "3.21.4"
#: The Kueue versions the bed can run: the floor the product is built on, and the newest the Go
#: module proxy serves (v0.19.3, v0.20.x and v0.21.x are refused: ``go list -m
#: sigs.k8s.io/kueue@v0.20.0`` says "server response: This module version is not available.").
KUEUE_FLOOR = "v0.17.0"
KUEUE_NEWEST = "v0.19.2"
KUEUE_VERSIONS = (KUEUE_FLOOR, KUEUE_NEWEST)
#: ``GPU_AUDITOR_TESTBED_KUEUE_VERSION`` picks one of :data:`KUEUE_VERSIONS` (default the floor).
#: A version other than the floor gets a state directory of its own (:func:`default_state_dir`):
#: the shared bed keeps running the floor while the newest is tested beside it.
KUEUE_VERSION_SWITCH = "GPU_AUDITOR_TESTBED_KUEUE_VERSION"


def _kueue_version() -> str:
    wanted = os.environ.get(KUEUE_VERSION_SWITCH, "").strip() or KUEUE_FLOOR
    if wanted not in KUEUE_VERSIONS:
        raise TestbedError("kueue", f"{KUEUE_VERSION_SWITCH}={wanted}: the bed runs one of {', '.join(KUEUE_VERSIONS)}")
    return wanted


#: Read once at import: the build script, the CRDs and the manager's manifests all follow it.
KUEUE_VERSION = _kueue_version()
#: ``GPU_AUDITOR_TESTBED_KUEUE=0`` starts the bed without the Kueue controller (CRDs only).
KUEUE_SWITCH = "GPU_AUDITOR_TESTBED_KUEUE"
KUEUE_DEFAULT = True


#: CRD sources: (Go module, pinned version, directory inside the module, label used in the cache)
#: Kueue: its plain ``crd/bases`` (the kustomized bundle adds conversion webhooks, which need a
#: Kueue webhook Service that cannot run here). Prometheus Operator: only the two kinds the chart
#: ships. Kubeflow: the v1 training operator's job kinds and Trainer v2's TrainJob. JobSet,
#: LeaderWorkerSet and KubeRay at the versions Kueue v0.17.0's go.mod requires (its build
#: downloads them): RayJob and RayCluster only.
@dataclass(frozen=True)
class CrdSource:
    module: str
    version: str
    subdir: str
    files: tuple[str, ...] | None = None  # None: every *.yaml except kustomization.yaml

    @property
    def label(self) -> str:
        return f"{self.module.replace('/', '_')}@{self.version}"


CRD_SOURCES: tuple[CrdSource, ...] = (
    CrdSource("sigs.k8s.io/kueue", KUEUE_VERSION, "config/components/crd/bases"),
    CrdSource(
        "github.com/prometheus-operator/prometheus-operator",
        "v0.85.0",
        "example/prometheus-operator-crd",
        ("monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml"),
    ),
    CrdSource("github.com/kubeflow/training-operator", "v1.8.1", "manifests/base/crds"),
    CrdSource("github.com/kubeflow/trainer/v2", "v2.0.0", "manifests/base/crds"),
    CrdSource("sigs.k8s.io/jobset", "v0.11.1", "config/components/crd/bases"),
    CrdSource("sigs.k8s.io/lws", "v0.8.0", "config/crd/bases"),
    CrdSource(
        "github.com/ray-project/kuberay/ray-operator",
        "v1.6.0",
        "config/crd/bases",
        ("ray.io_rayjobs.yaml", "ray.io_rayclusters.yaml"),
    ),
)

PACKAGE_DIR = Path(__file__).resolve().parent
BUILD_SCRIPT = PACKAGE_DIR / "build-binaries.sh"
REPO_ROOT = PACKAGE_DIR.parent.parent


def cache_dir() -> Path:
    """Per-user cache for built binaries and CRDs, outside the repo (``GPU_AUDITOR_CACHE`` overrides)."""
    env = os.environ.get("GPU_AUDITOR_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gpu-auditor"


def bin_dir() -> Path:
    return cache_dir() / "bin" / f"k8s-v{K8S_VERSION}-etcd-v{ETCD_VERSION}-helm-v{HELM_VERSION}"


def kueue_enabled() -> bool:
    """Whether the bed runs the Kueue controller (``GPU_AUDITOR_TESTBED_KUEUE``: 1/0)."""
    value = os.environ.get(KUEUE_SWITCH, "").strip().lower()
    if not value:
        return KUEUE_DEFAULT
    return value not in ("0", "false", "no", "off")


def kueue_bin() -> Path:
    return cache_dir() / "bin" / f"kueue-{KUEUE_VERSION}" / "kueue"


#: What the bed takes from Kueue's module besides the CRDs: its manager configuration (the base
#: the bed overrides) and its webhook configurations.
KUEUE_MANIFESTS = (
    CrdSource("sigs.k8s.io/kueue", KUEUE_VERSION, "config/components/manager", ("controller_manager_config.yaml",)),
    CrdSource("sigs.k8s.io/kueue", KUEUE_VERSION, "config/components/webhook", ("manifests.yaml",)),
)


def crd_dir() -> Path:
    return cache_dir() / "crds"


def default_state_dir() -> Path:
    """``<repo>/.testbed`` (git-ignored); ``GPU_AUDITOR_TESTBED_DIR`` overrides.

    With a Kueue other than the floor, ``<repo>/.testbed-kueue-<version>``: a bed is reused only
    when it runs the Kueue asked for, so the newest must not find (and replace) the shared bed.
    Without the node (``node.enabled`` gives it to ``.testbed`` only): one kubelet per machine.
    """
    env = os.environ.get("GPU_AUDITOR_TESTBED_DIR")
    if env:
        return Path(env).resolve()
    if KUEUE_VERSION != KUEUE_FLOOR:
        return REPO_ROOT / f".testbed-kueue-{KUEUE_VERSION}"
    return REPO_ROOT / ".testbed"
