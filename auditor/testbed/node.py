"""The bed's one real node: containerd, the kubelet and a fake GPU device plugin.

containerd, runc and the CNI plugins are Debian's packages; the kubelet is built at the bed's
Kubernetes version by ``build-binaries.sh``. Images come from ``image.py`` (the product image and
the pause image, built here) and are imported into containerd's ``k8s.io`` namespace: no
registry is ever contacted (pods use ``imagePullPolicy: Never``).

This machine has cgroup v1 (a hybrid hierarchy: v1 controllers, an empty cgroup2 at
``/sys/fs/cgroup/unified``). Kubernetes v1.36's kubelet still runs on v1 when told
``failCgroupV1: false`` (it logs the deprecation warning); the cgroup driver is ``cgroupfs``
(there is no systemd), the same in containerd (``SystemdCgroup = false``), and every cgroup the
node makes is under its own ``cgroupRoot`` named after the state directory, so two beds never
share one. Swap is off here; ``failSwapOn: false`` keeps the kubelet starting where it is on.

Everything else is kept on the bed's own paths: containerd's root, state and socket, the
kubelet's ``--root-dir`` (device-plugin and pod-resources sockets under it), pod logs, CNI
config. The node registers tainted ``gpu-auditor.io/testbed-node=true:NoSchedule``, so only pods
that tolerate it run there; pods that tests create and bind themselves to made-up nodes are never
the kubelet's business (it only acts on pods bound to its own node name).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import requests
import yaml

from auditor.testbed import binaries, config, image, kube, process
from auditor.testbed.errors import TestbedError
from auditor.testbed.launch import launch, log_path
from auditor.testbed.pki import Pki
from auditor.testbed.state import State

#: ``GPU_AUDITOR_TESTBED_NODE``: 0 starts a bed without the node (as before issue 19); 1 starts
#: it in any state directory. Unset, only the default bed (``.testbed``, what ``make testbed-up``
#: and ``make test`` start) has a node: a private bed that pytest starts in a temporary directory
#: would pay minutes for the image build, and only one kubelet per machine can serve device
#: plugins (``DEVICE_PLUGIN_DIR``).
NODE_SWITCH = "GPU_AUDITOR_TESTBED_NODE"
TAINT_KEY = "gpu-auditor.io/testbed-node"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
FAKE_GPUS = 4
#: Fixed in the kubelet (pkg/kubelet/cm/devicemanager/manager.go: pluginapi.KubeletSocket), not
#: under --root-dir: one node per machine can serve device plugins.
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
CNI_BIN = Path("/usr/lib/cni")
DEVICE_PLUGIN_API = config.CrdSource(
    "k8s.io/kubelet", f"v0.{config.K8S_VERSION.split('.', 1)[1]}", "pkg/apis/deviceplugin/v1beta1", ("api.proto",)
)


def enabled(state_dir: Path) -> bool:
    value = os.environ.get(NODE_SWITCH, "").strip().lower()
    if not value:
        return state_dir.resolve() == (config.REPO_ROOT / ".testbed").resolve()
    return value not in ("0", "false", "no", "off")


def node_name(state_dir: Path) -> str:
    return f"testbed-node-{_key(state_dir)[:6]}"


def _key(state_dir: Path) -> str:
    return hashlib.sha1(str(state_dir.resolve()).encode()).hexdigest()


def missing_packages() -> list[str]:
    need = {"containerd": "containerd", "ctr": "containerd", "runc": "runc", "buildah": "buildah"}
    need["mmdebstrap"] = "mmdebstrap"
    gone = sorted({pkg for exe, pkg in need.items() if shutil.which(exe) is None})
    if not (CNI_BIN / "bridge").exists():
        gone.append("containernetworking-plugins")
    return gone


def _dirs(state: State) -> dict[str, Path]:
    base = state.dir / "node"
    return {
        "base": base,
        "containerd": base / "containerd",
        "kubelet": base / "kubelet",
        "cni": base / "cni",
        "pod_logs": base / "pod-logs",
    }


def containerd_socket(state: State) -> Path:
    return _dirs(state)["containerd"] / "containerd.sock"


def pod_resources_socket(state: State) -> Path:
    return _dirs(state)["kubelet"] / "pod-resources" / "kubelet.sock"


def start(state: State, kubelet_bin: Path, pki: Pki, kubeconfig: Path) -> dict[str, str]:
    """Start containerd, import the images, start the kubelet and the device plugin; wait until
    the Node is Ready with its fake GPUs allocatable. Returns what ``.testbed/env`` gains."""
    gone = missing_packages()
    if gone:
        raise TestbedError("node", f"Debian packages missing: {' '.join(gone)} (`make system-deps` installs them)")
    other = _device_plugin_dir_in_use()
    if other:
        raise TestbedError("node", other)
    d = _dirs(state)
    for p in d.values():
        p.mkdir(parents=True, exist_ok=True)
    pause = image.build_pause()
    product = image.build_product()
    _start_containerd(state, d, pause.ref)
    for img in (pause, product):
        _ctr(state, "images", "import", "--no-unpack", str(img.archive))
    _write_cni(state, d["cni"])
    name = node_name(state.dir)
    _start_kubelet(state, d, kubelet_bin, pki, kubeconfig, name)
    _start_device_plugin(state, d, name)
    _wait_node(state, pki, name)
    state.set(node_name=name, node_image=product.ref, pod_resources_socket=str(pod_resources_socket(state)))
    return {"GPU_AUDITOR_IMAGE": product.ref, "TESTBED_NODE": name}


def _device_plugin_dir_in_use() -> str:
    """Why this machine cannot run another node ("" if it can): a running kubelet answers on the
    device-plugin registration socket, which every kubelet places at the same fixed path; a second
    one would take it over and the first bed's GPUs would vanish."""
    sock = DEVICE_PLUGIN_DIR / "kubelet.sock"
    if not sock.exists():
        return ""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(sock))
        except OSError:
            return ""  # left by a kubelet that is gone: the next one replaces it
    return (
        f"another kubelet serves device plugins on this machine ({sock} answers; one node per machine, "
        "the shared bed's usually): use that bed, or stop it first"
    )


def _start_containerd(state: State, d: dict[str, Path], sandbox_image: str) -> None:
    root = d["containerd"]
    cfg = root / "config.toml"
    cfg.write_text(
        f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"
[grpc]
  address = "{root / "containerd.sock"}"
[ttrpc]
  address = "{root / "containerd.sock.ttrpc"}"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  disable_apparmor = true
  # This machine withholds CAP_SYS_RESOURCE even from root, so no process may lower its
  # oom_score_adj; the kubelet asks -998 for every sandbox (runc: "failed to update
  # /proc/self/oom_score_adj: Permission denied"). Clamped to containerd's own value instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{d["cni"]}"
"""
    )

    def argv(p: dict[str, int]) -> Sequence[str]:
        return ["containerd", "--config", str(cfg), "--log-level", "warn"]

    def ready(p: dict[str, int]) -> Callable[[], bool]:
        return lambda: subprocess.run(_ctr_argv(state, "version"), capture_output=True, timeout=10).returncode == 0

    _, secs = launch(state, "containerd", argv, ready, marker=str(cfg), timeout=60)
    _say(f"containerd ready at {root / 'containerd.sock'} ({secs:.1f} s)")


def _ctr_argv(state: State, *args: str) -> list[str]:
    return ["ctr", "--address", str(containerd_socket(state)), "--namespace", "k8s.io", *args]


def _ctr(state: State, *args: str) -> str:
    proc = subprocess.run(_ctr_argv(state, *args), capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise TestbedError("node", f"`ctr {' '.join(args)}` exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout


def import_image(state: State, archive: Path) -> None:
    """Load one more image archive into the node's containerd (no registry)."""
    _ctr(state, "images", "import", "--no-unpack", str(archive))


def remove_image(state: State, ref: str) -> None:
    """Drop an image imported by ``import_image`` (containerd collects its content and snapshots
    once no container uses them)."""
    _ctr(state, "images", "rm", ref)


def _write_cni(state: State, conf_dir: Path) -> None:
    """A bridge network of the bed's own (name and /24 derived from the state directory)."""
    key = _key(state.dir)
    subnet = f"10.{200 + int(key[:2], 16) % 50}.{int(key[2:4], 16)}.0/24"
    conf = {
        "cniVersion": "1.0.0",
        "name": f"gpu-auditor-{key[:6]}",
        "plugins": [
            {
                "type": "bridge",
                "bridge": f"gpua{key[:6]}",
                "isGateway": True,
                "ipMasq": False,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": str(conf_dir / "ipam")},
            },
            {"type": "loopback"},
        ],
    }
    (conf_dir / "10-bed.conflist").write_text(json.dumps(conf, indent=2))


def host_ip() -> str:
    """The host's address on its default route: the kubelet refuses a loopback node IP, and
    host-network pods (the bed's only reachable kind) are probed there."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.254.254.254", 9))  # UDP: nothing is sent
        return str(s.getsockname()[0])


def _cgroup_root(state: State) -> str:
    return f"gpu-auditor-{_key(state.dir)[:8]}"


def _make_cgroup_root(state: State) -> None:
    """The kubelet wants its ``cgroupRoot`` to exist in every v1 hierarchy; cpuset's needs the
    parent's CPUs and memory nodes before anything can join it."""
    for hierarchy in sorted(Path("/sys/fs/cgroup").iterdir()):
        if hierarchy.name == "unified" or not hierarchy.is_dir():
            continue
        top = hierarchy / _cgroup_root(state)
        top.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":
            for f in ("cpuset.cpus", "cpuset.mems"):
                (top / f).write_text((hierarchy / f).read_text())


def _start_kubelet(state: State, d: dict[str, Path], kubelet_bin: Path, pki: Pki, kubeconfig: Path, name: str) -> None:
    cfg_path = d["base"] / "kubelet-config.yaml"
    _make_cgroup_root(state)

    def argv(p: dict[str, int]) -> Sequence[str]:
        cfg = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": "127.0.0.1",
            "port": p["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": p["healthz"],
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(pki.client_ca)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{containerd_socket(state)}",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "cgroupsPerQOS": True,
            "cgroupRoot": f"/{_cgroup_root(state)}",
            "enforceNodeAllocatable": ["pods"],
            "failSwapOn": False,
            "podLogsDir": str(d["pod_logs"]),
            "resolvConf": "",
            "maxPods": 30,
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # a shared 2-core development machine's disk fills up; evicting the bed's pods for it
            # would only make tests flaky
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "registerWithTaints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}],
            "nodeStatusReportFrequency": "10s",
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "5s",
        }
        cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return [
            str(kubelet_bin),
            f"--config={cfg_path}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={d['kubelet']}",
            f"--cert-dir={d['base'] / 'kubelet-pki'}",
            f"--hostname-override={name}",
            f"--node-ip={host_ip()}",
            # nvidia.com/gpu.present: what GPU feature discovery labels a GPU node with, and the
            # chart's node-agent DaemonSet selects
            f"--node-labels={TAINT_KEY}=true,nvidia.com/gpu.present=true",
            "--v=1",
        ]

    def ready(p: dict[str, int]) -> Callable[[], bool]:
        return lambda: process.local_get(f"http://127.0.0.1:{p['healthz']}/healthz", timeout=3).status_code == 200

    _, secs = launch(state, "kubelet", argv, ready, ports=("kubelet", "healthz"), marker=str(cfg_path), timeout=120)
    _say(f"kubelet v{config.K8S_VERSION} ready as node {name} ({secs:.1f} s)")


def device_plugin_proto() -> Path:
    """The kubelet's device-plugin API proto, from its Go module at the bed's version."""
    (proto,) = binaries.module_files(DEVICE_PLUGIN_API)
    return proto


def _start_device_plugin(state: State, d: dict[str, Path], name: str) -> None:
    plugin_dir = DEVICE_PLUGIN_DIR
    proto = device_plugin_proto()

    def argv(p: dict[str, int]) -> Sequence[str]:
        return [
            sys.executable,
            "-m",
            "auditor.testbed.deviceplugin",
            f"--plugin-dir={plugin_dir}",
            f"--proto={proto}",
            f"--gen={d['base'] / 'deviceplugin-gen'}",
            f"--node={name}",
            f"--count={FAKE_GPUS}",
        ]

    def ready(p: dict[str, int]) -> Callable[[], bool]:
        return lambda: "registered" in log_path(state, "deviceplugin").read_text()

    _, secs = launch(state, "deviceplugin", argv, ready, marker=str(plugin_dir), timeout=120)
    _say(f"fake GPU device plugin registered ({FAKE_GPUS} x nvidia.com/gpu) ({secs:.1f} s)")


def _wait_node(state: State, pki: Pki, name: str, timeout: float = 120) -> None:
    session = kube.admin_session(pki)
    url = f"{state.values['apiserver_url']}/api/v1/nodes/{name}"
    deadline = time.monotonic() + timeout
    last = "not registered"
    while time.monotonic() < deadline:
        resp = session.get(url, timeout=10)
        if resp.status_code == 200:
            status = resp.json().get("status") or {}
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
            gpus = (status.get("allocatable") or {}).get("nvidia.com/gpu", "0")
            if ready and gpus == str(FAKE_GPUS):
                _untaint_not_ready(session, url, resp.json())
                _say(f"node {name} Ready with {gpus} x nvidia.com/gpu")
                return
            last = f"Ready={ready}, nvidia.com/gpu allocatable {gpus}"
        time.sleep(1)
    raise TestbedError(
        "node", f"node {name} not Ready with GPUs after {timeout:.0f} s: {last}", log_path(state, "kubelet")
    )


def _untaint_not_ready(session: requests.Session, url: str, node_obj: dict) -> None:
    """Remove the ``node.kubernetes.io/not-ready`` taint the kubelet registers with.

    The node lifecycle controller removes it once the node is Ready; the bed does not run that
    controller (it would taint and evict the pods tests bind to nodes without a kubelet), so the
    bed does its one step for its one real node. The kubelet adds the taint only at registration.
    """
    taints = (node_obj.get("spec") or {}).get("taints") or []
    keep = [t for t in taints if t.get("key") != NOT_READY_TAINT]
    if keep == taints:
        return
    patch = [
        {"op": "test", "path": "/spec/taints", "value": taints},
        {"op": "replace", "path": "/spec/taints", "value": keep},
    ]
    resp = session.patch(url, json=patch, headers={"Content-Type": "application/json-patch+json"}, timeout=10)
    if resp.status_code != 200:
        raise TestbedError("node", f"removing the {NOT_READY_TAINT} taint: HTTP {resp.status_code} {resp.text[:300]}")


def clean(state: State) -> None:
    """What the node leaves behind its processes, removed: containers (killed through containerd
    while it runs), mounts under the node's directories (volumes, rootfs, netns), its cgroups and
    its bridge. Safe to call when nothing of it ever started."""
    if "containerd" in state.procs and containerd_socket(state).exists():
        listed = subprocess.run(_ctr_argv(state, "tasks", "ls", "-q"), capture_output=True, text=True, timeout=30)
        for task in listed.stdout.split():
            subprocess.run(_ctr_argv(state, "tasks", "kill", "-s", "SIGKILL", task), capture_output=True, timeout=30)
            subprocess.run(_ctr_argv(state, "tasks", "delete", "-f", task), capture_output=True, timeout=30)
    base = str(_dirs(state)["base"])
    with open("/proc/self/mounts") as fh:
        points = [line.split()[1] for line in fh]
    for point in sorted((p for p in points if p == base or p.startswith(base + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)
    root = _cgroup_root(state)
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / root
        if top.is_dir():
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                _rmdir(d)
            _rmdir(top)
    subprocess.run(["ip", "link", "delete", f"gpua{_key(state.dir)[:6]}"], capture_output=True, timeout=30)


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


def healthy(state: State) -> bool:
    proc = state.procs.get("kubelet")
    if proc is None:
        return False
    try:
        return process.local_get(f"http://127.0.0.1:{proc.ports['healthz']}/healthz", timeout=3).status_code == 200
    except requests.RequestException:
        return False


def _say(msg: str) -> None:
    print(f"testbed: {msg}", file=sys.stderr, flush=True)
