"""etcd, kube-apiserver and kube-controller-manager on loopback, and the CRDs the project uses.

Flags follow envtest and Kubernetes' integration-test server (reference/control-plane.md §3),
with the controller manager limited to controllers that never create pods: no kubelet or
scheduler runs, so tests create pods themselves and must not race a Job or ReplicaSet controller.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import requests
import urllib3
import yaml

from auditor.testbed import config, process
from auditor.testbed.binaries import Binaries
from auditor.testbed.errors import TestbedError
from auditor.testbed.launch import launch, log_path
from auditor.testbed.pki import Pki
from auditor.testbed.state import State

#: Controllers the kube-controller-manager runs. Deliberately no job, replicaset, deployment,
#: statefulset or daemonset controllers (their pods would stay Pending and fight test-made pods)
#: and no pod-garbage-collector (it deletes pods bound to nodes that do not exist).
CONTROLLERS = (
    "namespace-controller",
    "garbage-collector-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
)


def admin_session(pki: Pki) -> requests.Session:
    """HTTP to the apiserver as the bed's admin (for components that need no client library)."""
    return _session(pki)


def _session(pki: Pki) -> requests.Session:
    s = requests.Session()
    # without this, REQUESTS_CA_BUNDLE in the environment silently overrides ``verify`` (requests#3829)
    s.trust_env = False
    s.cert = (str(pki.admin_cert), str(pki.admin_key))
    s.verify = str(pki.serving_ca)
    return s


def start_etcd(state: State, bins: Binaries) -> str:
    data = state.dir / "etcd"

    def argv(p: dict[str, int]) -> Sequence[str]:
        client, peer = f"http://127.0.0.1:{p['client']}", f"http://127.0.0.1:{p['peer']}"
        return [
            str(bins.etcd),
            "--name=default",
            f"--data-dir={data}",
            "--log-level=warn",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync=true",
            "--listen-metrics-urls=",
            "--quota-backend-bytes=4294967296",
        ]

    def ready(p: dict[str, int]) -> Callable[[], bool]:
        return lambda: (
            process.local_get(f"http://127.0.0.1:{p['client']}/health", timeout=2).json().get("health") == "true"
        )

    proc, secs = launch(state, "etcd", argv, ready, ports=("client", "peer"), marker=str(data), timeout=60)
    url = f"http://127.0.0.1:{proc.ports['client']}"
    state.set(etcd_url=url)
    _say(f"etcd ready at {url} ({secs:.1f} s)")
    return url


def start_apiserver(state: State, bins: Binaries, pki: Pki, etcd_url: str, version: str = config.K8S_VERSION) -> str:
    def argv(p: dict[str, int]) -> Sequence[str]:
        port = p["secure"]
        return [
            str(bins.kube_apiserver),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={pki.dir}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.client_ca}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            "--disable-admission-plugins=ServiceAccount",
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=1",
        ]

    def ready(p: dict[str, int]) -> Callable[[], bool]:
        s = _session(pki)
        return lambda: s.get(f"https://127.0.0.1:{p['secure']}/readyz", timeout=5).status_code == 200

    proc, secs = launch(state, "kube-apiserver", argv, ready, ports=("secure",), marker=str(pki.dir), timeout=180)
    url = f"https://127.0.0.1:{proc.ports['secure']}"
    served = _session(pki).get(f"{url}/version", timeout=5).json().get("gitVersion")
    if served != f"v{version}":
        raise TestbedError(
            "kube-apiserver",
            f"/version reports {served!r}, expected v{version}",
            log_path(state, "kube-apiserver"),
        )
    state.set(apiserver_url=url)
    _say(f"kube-apiserver {served} ready at {url} ({secs:.1f} s)")
    return url


def write_kubeconfig(path: Path, server: str, pki: Pki) -> Path:
    """An admin kubeconfig with everything inline, so it works from any directory or copy."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "testbed", "cluster": {"server": server, "certificate-authority-data": b64(pki.serving_ca)}}
        ],
        "users": [
            {
                "name": "admin",
                "user": {"client-certificate-data": b64(pki.admin_cert), "client-key-data": b64(pki.admin_key)},
            }
        ],
        "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": "admin"}}],
        "current-context": "testbed",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    path.chmod(0o600)
    return path


def start_controller_manager(state: State, bins: Binaries, pki: Pki, kubeconfig: Path) -> None:
    def argv(p: dict[str, int]) -> Sequence[str]:
        return [
            str(bins.kube_controller_manager),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['secure']}",
            f"--cert-dir={state.dir / 'kcm-certs'}",
            f"--controllers={','.join(CONTROLLERS)}",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.serving_ca}",
            "--use-service-account-credentials=false",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
            "--v=1",
        ]

    def ready(p: dict[str, int]) -> Callable[[], bool]:
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        # its self-signed serving cert: nothing secret travels on this probe
        return lambda: (
            process.local_get(f"https://127.0.0.1:{p['secure']}/healthz", verify=False, timeout=3).status_code == 200
        )

    proc, secs = launch(
        state, "kube-controller-manager", argv, ready, ports=("secure",), marker=str(kubeconfig), timeout=120
    )
    _say(f"kube-controller-manager ready ({', '.join(CONTROLLERS)}) ({secs:.1f} s)")


def apply_crds(state: State, bins: Binaries, pki: Pki, kubeconfig: Path, files: list[Path]) -> None:
    """Server-side apply (some CRDs exceed client-side apply's annotation limit), then wait.

    One kubectl per source module, run concurrently: about 14 s on a loaded 2-core machine against
    about 20 s for one kubectl applying all 22 in sequence (each CRD makes the apiserver rebuild
    its OpenAPI document, which dominates).
    """
    log = log_path(state, "crds")
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    groups: dict[Path, list[Path]] = {}
    for f in files:
        groups.setdefault(f.parent, []).append(f)
    base = [
        str(bins.kubectl),
        f"--kubeconfig={kubeconfig}",
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=gpu-auditor-testbed",
    ]
    with open(log, "ab") as out:
        procs = [
            subprocess.Popen(base + [a for f in group for a in ("-f", str(f))], stdout=out, stderr=subprocess.STDOUT)
            for group in groups.values()
        ]
        codes = [p.wait() for p in procs]
    if any(codes):
        raise TestbedError("CRDs", f"kubectl apply --server-side exited with codes {codes}", log)
    names = {_crd_name(f) for f in files}
    api = state.values["apiserver_url"]
    session = _session(pki)
    deadline = time.monotonic() + 120
    while True:
        items = session.get(f"{api}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", timeout=30).json()["items"]
        established = {
            i["metadata"]["name"]
            for i in items
            if any(
                c.get("type") == "Established" and c.get("status") == "True"
                for c in (i.get("status") or {}).get("conditions") or []
            )
        }
        if names <= established:
            break
        if time.monotonic() > deadline:
            raise TestbedError("CRDs", f"not Established after 120 s: {sorted(names - established)}", log)
        time.sleep(0.3)
    state.set(crds=sorted(names))
    _say(f"{len(names)} CRDs established ({time.monotonic() - t0:.1f} s)")


def _crd_name(path: Path) -> str:
    """metadata.name without parsing the whole (large) manifest."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.rstrip() == "metadata:":
            for inner in lines[i + 1 :]:
                if not inner.startswith(" "):
                    break
                if inner.startswith("  name:"):
                    return inner.split(":", 1)[1].strip()
    raise TestbedError("CRDs", f"{path}: no metadata.name found")


def healthy(state: State) -> bool:
    url = state.values.get("apiserver_url")
    pki_dir = state.values.get("pki_dir")
    if not url or not pki_dir:
        return False
    try:
        return _session(Pki(Path(pki_dir))).get(f"{url}/readyz", timeout=5).status_code == 200
    except requests.RequestException:
        return False


def _say(msg: str) -> None:
    print(f"testbed: {msg}", file=sys.stderr, flush=True)
