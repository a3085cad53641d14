"""Fixtures of the node tests: the bed's real node, the current tree's image in its containerd,
and, for the module only, the controllers and scheduler that turn the chart's objects into pods.

The bed runs no Deployment/ReplicaSet/DaemonSet controller and no scheduler (docs/testbed.md:
they would fight the pods other tests make themselves). These tests start a second
kube-controller-manager with exactly those three controllers and a kube-scheduler whose only
profile is ``gpu-auditor-testbed`` (the post-renderer names it in the chart's pods), and stop
them when the module ends: other tests' pods (default scheduler name) are never scheduled.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import yaml
from nodelib import SCHEDULER

from auditor.testbed import config, image, node, process
from auditor.testbed.state import State

WORKLOAD_CONTROLLERS = ("deployment-controller", "replicaset-controller", "daemonset-controller")


@dataclass(frozen=True)
class Node:
    name: str
    image_repository: str
    image_tag: str
    pod_resources_dir: Path
    pod_logs_dir: Path
    state: State


@pytest.fixture(scope="module")
def bed_node(testbed) -> Iterator[Node]:
    state = State.load(Path(testbed.state_dir))
    assert state is not None
    if not testbed.node_name:
        why = state.values.get("node_error") or (
            f"{node.NODE_SWITCH}=0, or the running bed was started without it (restart it)"
        )
        pytest.fail(f"the test bed has no node: {why}", pytrace=False)
    # The image of this tree (the chart under test renders settings this tree's code reads), built
    # before the run (tests/conftest.py, NODE_IMAGE_ENV); the bed's own is that of the tree it
    # started from. On a fresh clone both are the same.
    archive = os.environ.get("GPU_AUDITOR_NODE_TEST_IMAGE")
    if not archive:
        pytest.fail("no image was built before the run for the node tests", pytrace=False)
    tag = Path(archive).stem.removeprefix("gpu-auditor-")
    repository = image.REPOSITORY
    imported = f"{repository}:{tag}" != testbed.image
    if imported:
        node.import_image(state, Path(archive))
    yield Node(
        name=testbed.node_name,
        image_repository=repository,
        image_tag=tag,
        pod_resources_dir=node.pod_resources_socket(state).parent,
        pod_logs_dir=Path(state.values["pki_dir"]).parent / "node" / "pod-logs",
        state=state,
    )
    if imported:  # ~1.2 GB in the long-lived shared bed's containerd per session otherwise
        node.remove_image(state, f"{repository}:{tag}")


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that started it ends (pytest's main
    thread, so: when pytest ends, however it ends; a killed run leaves no scheduler behind)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@pytest.fixture(scope="module")
def workload_controllers(testbed, bed_node, tmp_path_factory) -> Iterator[None]:
    work = tmp_path_factory.mktemp("workload-controllers")
    sched_cfg = work / "scheduler.yaml"
    sched_cfg.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": testbed.kubeconfig},
                "leaderElection": {"leaderElect": False},
                "profiles": [{"schedulerName": SCHEDULER}],
            }
        )
    )
    bins = config.bin_dir()
    argvs = {
        "kube-controller-manager": [
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={testbed.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={process.free_port()}",
            f"--cert-dir={work / 'kcm-certs'}",
            f"--controllers={','.join(WORKLOAD_CONTROLLERS)}",
            "--concurrent-deployment-syncs=2",
            "--v=1",
        ],
        "kube-scheduler": [
            str(bins / "kube-scheduler"),
            f"--config={sched_cfg}",
            "--bind-address=127.0.0.1",
            f"--secure-port={process.free_port()}",
            "--v=1",
        ],
    }
    procs = []
    for name, argv in argvs.items():
        log = open(work / f"{name}.log", "wb")
        procs.append(
            (
                subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent
                ),
                log,
            )
        )
    try:
        yield
    finally:
        for p, log in procs:
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            log.close()


@pytest.fixture(scope="module")
def module_database(testbed) -> Iterator[str]:
    """A fresh PostgreSQL database for the module's release (the ``postgres_url`` fixture is per test)."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(testbed.postgres_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(testbed.postgres_admin_url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(testbed.postgres_admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
