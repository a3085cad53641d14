"""Fixtures for the node agent: a real kubelet pod-resources gRPC server, generated from the kubelet's proto.

The server side is generated at test time with grpcio-tools from the kubelet's own published
``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`` (from the Go module cache, where the test
bed's build puts it; else ``go mod download``), so the agent's hand-written message definitions
are checked against the real API on the wire. Nothing generated is kept in the repository.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent import futures
from pathlib import Path
from typing import Any, Iterator

import pytest

from auditor.testbed.config import K8S_VERSION
from auditor.testbed.process import free_port


def _kubelet_module() -> str:
    major, minor, patch = K8S_VERSION.split(".")
    return f"k8s.io/kubelet@v0.{minor}.{patch}"


def _find_proto() -> Path:
    """``podresources/v1/api.proto`` of the pinned kubelet module (downloaded if not cached)."""
    module = _kubelet_module()
    go = shutil.which("go") or "/usr/local/go/bin/go"
    cache = os.environ.get("GOMODCACHE") or str(Path.home() / "go" / "pkg" / "mod")
    if os.path.exists(go):
        out = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, timeout=60)
        cache = out.stdout.strip() or cache
    proto = Path(cache) / module / "pkg" / "apis" / "podresources" / "v1" / "api.proto"
    if proto.exists():
        return proto
    if not os.path.exists(go):
        pytest.fail(f"kubelet proto not in the Go module cache ({proto}) and no go binary to download {module}")
    out = subprocess.run(
        [go, "mod", "download", "-json", module], capture_output=True, text=True, timeout=600, cwd=tempfile.gettempdir()
    )
    if out.returncode != 0:
        pytest.fail(f"go mod download {module} failed: {out.stderr or out.stdout}")
    proto = Path(json.loads(out.stdout)["Dir"]) / "pkg" / "apis" / "podresources" / "v1" / "api.proto"
    if not proto.exists():
        pytest.fail(f"{module} has no {proto}")
    return proto


@pytest.fixture(scope="session")
def kubelet_api(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The kubelet's v1 pod-resources API as Python modules (``pb2``, ``grpc``), generated now."""
    proto = _find_proto()
    out = tmp_path_factory.mktemp("podresources_gen")
    pkg = out / "kubelet_podresources_v1"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copy(proto, pkg / "api.proto")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{out}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            str(pkg / "api.proto"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if res.returncode != 0:
        pytest.fail(f"grpc_tools.protoc failed on {proto}: {res.stderr}")
    sys.path.insert(0, str(out))
    try:
        pb2 = importlib.import_module("kubelet_podresources_v1.api_pb2")
        grpc_mod = importlib.import_module("kubelet_podresources_v1.api_pb2_grpc")
    finally:
        sys.path.remove(str(out))

    class Api:
        pass

    api = Api()
    api.pb2, api.grpc, api.proto = pb2, grpc_mod, proto
    return api


class PodResourcesServer:
    """A real gRPC server on a unix socket answering ``List`` with what the test set."""

    def __init__(self, api: Any, socket_path: str) -> None:
        import grpc

        self.api = api
        self.socket_path = socket_path
        self.pods: list[Any] = []
        self.calls = 0
        outer = self

        class Servicer(api.grpc.PodResourcesListerServicer):
            def List(self, request: Any, context: Any) -> Any:
                outer.calls += 1
                return api.pb2.ListPodResourcesResponse(pod_resources=outer.pods)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api.grpc.add_PodResourcesListerServicer_to_server(Servicer(), self.server)
        if self.server.add_insecure_port(f"unix://{socket_path}") == 0:
            pytest.fail(f"cannot listen on unix://{socket_path}")
        self.server.start()

    def set_pods(self, *pods: tuple[str, str, str, str, list[str]]) -> None:
        """Pods as (namespace, pod, container, resource, device ids); extra fields the agent ignores are filled in."""
        pb = self.api.pb2
        out = []
        for ns, name, container, resource, ids in pods:
            out.append(
                pb.PodResources(
                    name=name,
                    namespace=ns,
                    containers=[
                        pb.ContainerResources(
                            name=container,
                            devices=[
                                pb.ContainerDevices(
                                    resource_name=resource,
                                    device_ids=ids,
                                    topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=0)]),
                                )
                            ],
                            cpu_ids=[2, 3],
                            memory=[pb.ContainerMemory(memory_type="memory", size=1 << 30)],
                        )
                    ],
                )
            )
        self.pods = out

    def stop(self) -> None:
        self.server.stop(grace=None).wait(5)


@pytest.fixture
def kubelet(kubelet_api: Any) -> Iterator[PodResourcesServer]:
    """A running pod-resources server (real gRPC, kubelet proto) on a fresh unix socket."""
    d = tempfile.mkdtemp(prefix="podres-", dir="/tmp")  # unix socket paths must stay short
    server = PodResourcesServer(kubelet_api, os.path.join(d, "kubelet.sock"))
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(d, ignore_errors=True)


def _prometheus_binary() -> str:
    path = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not os.path.exists(path):
        pytest.fail("Debian prometheus (/usr/bin/prometheus) is not installed")
    return path


@pytest.fixture
def scraping_prometheus():
    """Start a private Prometheus; yields a function(*targets, interval="1s") -> base URL.

    Each target is its own scrape job (``gpu-auditor-agent``, ``gpu-auditor-agent-1``, …), scraped every
    ``interval``."""
    procs: list[subprocess.Popen] = []
    d = Path(tempfile.mkdtemp(prefix="agent-prom-"))

    def start(*targets: str, interval: str = "1s") -> str:
        port = free_port()
        jobs = "".join(
            f"  - job_name: {'gpu-auditor-agent' if i == 0 else f'gpu-auditor-agent-{i}'}\n    honor_labels: true\n"
            f"    static_configs:\n      - targets: ['{t}']\n"
            for i, t in enumerate(targets)
        )
        (d / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {interval}\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n" + jobs
        )
        log = open(d / "prometheus.log", "wb")
        procs.append(
            subprocess.Popen(
                [
                    _prometheus_binary(),
                    f"--config.file={d / 'prometheus.yml'}",
                    f"--storage.tsdb.path={d / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--storage.tsdb.retention.time=1d",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            if procs[-1].poll() is not None:
                pytest.fail(f"prometheus exited: {(d / 'prometheus.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return url
            except OSError:
                time.sleep(0.2)
        pytest.fail(f"prometheus not ready: {(d / 'prometheus.log').read_text()[-2000:]}")

    try:
        yield start
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        shutil.rmtree(d, ignore_errors=True)
