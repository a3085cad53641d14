"""A kube-apiserver (and its etcd) of the chart's floor Kubernetes version, for one test session.

The chart says which Kubernetes it needs (Chart.yaml's kubeVersion, templates/_versions.tpl);
a floor is only true if the chart installs on an apiserver of that version, so the tests start
one: kube-apiserver built from the Go module proxy by the same ``build-binaries.sh`` as the bed's
(only that binary, cached by version under ``<cache>/bin/kube-apiserver-v<version>/``), the bed's
etcd, a PKI and a state directory of its own, on free ports. ``down`` (the bed's, on that state
directory) stops it; a watchdog stops it if the owning pytest is killed.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from auditor.testbed import binaries, config, kube
from auditor.testbed.errors import TestbedError
from auditor.testbed.pki import generate
from auditor.testbed.state import State

#: The lowest Kubernetes the default chart supports (Chart.yaml's kubeVersion is its minor):
#: ValidatingAdmissionPolicy v1, the write fence, went GA in 1.30. The newest 1.30 patch.
FLOOR_K8S_VERSION = "1.30.14"


@dataclass(frozen=True)
class FloorServer:
    """A running floor apiserver: its version, URL, admin kubeconfig and state directory."""

    version: str
    url: str
    kubeconfig: Path
    state_dir: Path


def apiserver_path(version: str = FLOOR_K8S_VERSION) -> Path:
    return config.cache_dir() / "bin" / f"kube-apiserver-v{version}" / "kube-apiserver"


def build(version: str = FLOOR_K8S_VERSION, log: Path | None = None) -> Path:
    """The floor's kube-apiserver, built on first use (cold: many minutes; ``log`` gets the progress)."""
    target = apiserver_path(version)
    if os.access(target, os.X_OK):
        return target
    with binaries.file_lock(config.cache_dir() / "build.lock"):
        if os.access(target, os.X_OK):
            return target
        env = dict(
            os.environ,
            K8S_VERSION=version,
            K8S_BINS="kube-apiserver",
            K8S_ONLY="1",
            K8S_OUT=str(target.parent),
            GPU_AUDITOR_CACHE=str(config.cache_dir()),
        )
        if log:
            log.parent.mkdir(parents=True, exist_ok=True)
        err = open(log, "ab") if log else None  # None: the progress goes to our stderr
        try:
            proc = subprocess.run(["bash", str(config.BUILD_SCRIPT)], env=env, stdout=subprocess.DEVNULL, stderr=err)
        finally:
            if err:
                err.close()
    if proc.returncode != 0 or not os.access(target, os.X_OK):
        raise TestbedError(
            f"kube-apiserver v{version}", f"{config.BUILD_SCRIPT.name} exited with code {proc.returncode}", log
        )
    return target


def up(state_dir: Path, version: str = FLOOR_K8S_VERSION, *, owner_pid: int | None = None) -> FloorServer:
    """Start etcd and the floor's kube-apiserver in ``state_dir`` (fresh); stop them with ``down``."""
    bins = dataclasses.replace(binaries.locate(), kube_apiserver=build(version, state_dir / "logs" / "build.log"))
    state = State(state_dir)
    if owner_pid is not None:
        # imported here: `python -m auditor.testbed.watchdog` must not find it imported already
        from auditor.testbed import watchdog

        state.set(watchdog_pid=watchdog.spawn(state_dir, owner_pid), owner_pid=owner_pid)
    pki = generate(state_dir / "pki")
    url = kube.start_apiserver(state, bins, pki, kube.start_etcd(state, bins), version=version)
    kubeconfig = kube.write_kubeconfig(state_dir / "kubeconfig", url, pki)
    return FloorServer(version=version, url=url, kubeconfig=kubeconfig, state_dir=state_dir)


def down(server: FloorServer) -> int:
    """Stop the floor's processes (the bed's ``down``, on the floor's own state directory)."""
    from auditor.testbed import bed

    return bed.down(server.state_dir, quiet=True)
