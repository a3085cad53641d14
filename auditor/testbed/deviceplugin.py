"""A fake NVIDIA device plugin for the bed's node: the kubelet device-plugin API v1beta1, for real.

The node has no GPU. This plugin advertises ``--count`` healthy ``nvidia.com/gpu`` devices with
GPU-like UUIDs (``GPU-testbed-<node>-<i>``), registers with the kubelet's ``Registration``
service, and answers ``Allocate`` with an environment variable naming the devices (what the
real plugin's ``envvar`` strategy does) and no device nodes. So the scheduler sees GPU capacity,
the kubelet's device manager allocates real device IDs to GPU pods, and the kubelet's
pod-resources API reports them, exactly the path the node agent reads on a real node.

The gRPC stubs are generated at start from the kubelet's own published ``api.proto`` (copied out
of the Go module cache by the bed), with ``grpc_tools`` (dev extra): no generated code is kept.

Run by the bed: ``python -m auditor.testbed.deviceplugin --plugin-dir DIR --proto FILE --gen DIR``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any, Iterator, Sequence

import grpc

RESOURCE = "nvidia.com/gpu"
ENDPOINT = "gpu-auditor-fake-gpu.sock"
VERSION = "v1beta1"
log = logging.getLogger("deviceplugin")


def generate(proto: Path, out: Path) -> tuple[Any, Any]:
    """(api_pb2, api_pb2_grpc) generated from the kubelet's proto into ``out``."""
    pkg = out / "kubelet_deviceplugin_v1beta1"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "api.proto").write_bytes(proto.read_bytes())
    argv = [sys.executable, "-m", "grpc_tools.protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}"]
    subprocess.run(argv + [str(pkg / "api.proto")], check=True, timeout=120)
    sys.path.insert(0, str(out))
    return (
        importlib.import_module("kubelet_deviceplugin_v1beta1.api_pb2"),
        importlib.import_module("kubelet_deviceplugin_v1beta1.api_pb2_grpc"),
    )


def device_ids(node: str, count: int) -> list[str]:
    return [f"GPU-testbed-{node}-{i}" for i in range(count)]


def serve(plugin_dir: Path, proto: Path, gen: Path, node: str, count: int) -> None:
    pb2, pb2_grpc = generate(proto, gen)
    ids = device_ids(node, count)
    stop = threading.Event()

    class Plugin(pb2_grpc.DevicePluginServicer):  # type: ignore[name-defined]
        def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
            return pb2.DevicePluginOptions()

        def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
            yield pb2.ListAndWatchResponse(devices=[pb2.Device(ID=i, health="Healthy") for i in ids])
            while not stop.wait(5) and context.is_active():
                pass

        def Allocate(self, request: Any, context: Any) -> Any:
            answers = [
                pb2.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(c.devices_ids)})
                for c in request.container_requests
            ]
            log.info("allocated %s", [list(c.devices_ids) for c in request.container_requests])
            return pb2.AllocateResponse(container_responses=answers)

        def PreStartContainer(self, request: Any, context: Any) -> Any:
            return pb2.PreStartContainerResponse()

        def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
            return pb2.PreferredAllocationResponse()

    sock = plugin_dir / ENDPOINT
    kubelet_sock = plugin_dir / "kubelet.sock"
    while not stop.is_set():
        while not kubelet_sock.exists():  # the kubelet makes the directory and its socket
            time.sleep(0.5)
        sock.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb2_grpc.add_DevicePluginServicer_to_server(Plugin(), server)
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        _register(pb2, pb2_grpc, kubelet_sock)
        log.info("registered %s with %d devices at %s", RESOURCE, len(ids), sock)
        # The kubelet removes every plugin socket when it restarts: register again then.
        while sock.exists() and not stop.wait(1):
            pass
        server.stop(0)


def _register(pb2: Any, pb2_grpc: Any, kubelet_sock: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            with grpc.insecure_channel(f"unix://{kubelet_sock}") as ch:
                pb2_grpc.RegistrationStub(ch).Register(
                    pb2.RegisterRequest(version=VERSION, endpoint=ENDPOINT, resource_name=RESOURCE), timeout=10
                )
            return
        except grpc.RpcError as exc:
            if time.monotonic() > deadline:
                raise SystemExit(f"deviceplugin: kubelet registration at {kubelet_sock} failed: {exc}") from exc
            time.sleep(1)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m auditor.testbed.deviceplugin")
    p.add_argument("--plugin-dir", type=Path, required=True, help="the kubelet's <root-dir>/device-plugins")
    p.add_argument("--proto", type=Path, required=True, help="k8s.io/kubelet pkg/apis/deviceplugin/v1beta1/api.proto")
    p.add_argument("--gen", type=Path, required=True, help="where the generated stubs go")
    p.add_argument("--node", default=os.uname().nodename)
    p.add_argument("--count", type=int, default=4)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(args.plugin_dir, args.proto, args.gen, args.node, args.count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
