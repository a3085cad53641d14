"""The real Kueue controller in the test bed, with its admission webhooks served on loopback.

Kueue runs against the bare apiserver (no cert-manager, kubelet or scheduler) as the admin user.
Its configuration starts from the module's own ``config/components/manager/
controller_manager_config.yaml`` with the fields a loopback bed needs overridden; its webhook
configurations are the module's ``config/components/webhook/manifests.yaml`` with each
``clientConfig.service`` replaced by ``url: https://127.0.0.1:<port><path>`` and the bed's CA.

The Kueue version is ``config.KUEUE_VERSION`` (v0.17.0, or v0.19.2 with
``GPU_AUDITOR_TESTBED_KUEUE_VERSION``): binary, CRDs and these two manifests from that module.

Kueue (v0.17.0 and v0.19.2) opens ``/etc/kueue/metrics/certs/tls.{crt,key}`` at start whenever its internal
certificate management is off, even with metrics off (``cmd/kueue/main.go``). The bed never writes
there: Kueue runs in a private mount namespace (``unshare -m``) whose ``/etc`` is an overlay with a
tmpfs upper layer holding a copy of the webhook certificate, so the host's ``/etc`` stays as it was
and the overlay vanishes with the process.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import requests
import yaml

from auditor.testbed import config, process
from auditor.testbed.errors import TestbedError
from auditor.testbed.kube import _session
from auditor.testbed.launch import launch, log_path
from auditor.testbed.pki import Pki
from auditor.testbed.state import State

NAMESPACE = "kueue-system"
KUEUE_GROUP = "kueue.x-k8s.io"
#: Kueue's job integrations for the kinds whose CRDs (at an API version Kueue serves) the bed
#: installs. Not kubeflow.org/mpijob (Kueue watches MPIJob v2beta1; the bed has the training
#: operator's v1), and none that manages pods: pod/deployment/statefulset, nor
#: leaderworkerset.x-k8s.io/leaderworkerset, which enables the pod integration implicitly. The
#: tests create pods themselves and Kueue must not gate them.
FRAMEWORKS = (
    "batch/job",
    "jobset.x-k8s.io/jobset",
    "kubeflow.org/pytorchjob",
    "kubeflow.org/tfjob",
    "kubeflow.org/xgboostjob",
    "kubeflow.org/paddlejob",
    "trainer.kubeflow.org/trainjob",
    "ray.io/rayjob",
    "ray.io/raycluster",
)
#: Alpha in v0.17.0 (pkg/features/kube_features.go; in v0.19 AdmissionGatedBy is beta and on by
#: default, PriorityBoost still alpha and off): the admission gate and priority boost are what
#: gpu-auditor's admission-time actions use, set on for both versions. VisibilityOnDemand (beta, on
#: by default) serves an aggregated API that needs an APIService and a Service: off.
FEATURE_GATES = {"AdmissionGatedBy": True, "PriorityBoost": True, "VisibilityOnDemand": False}
WEBHOOK_PREFIX = "kueue-"


def _say(msg: str) -> None:
    print(f"testbed: {msg}", file=sys.stderr, flush=True)


def configuration(base: dict[str, Any], *, health_port: int, webhook_port: int, cert_dir: Path) -> dict[str, Any]:
    """The module's manager configuration with what a loopback test bed needs changed."""
    cfg = copy.deepcopy(base)
    cfg["namespace"] = NAMESPACE
    cfg["health"] = {**(cfg.get("health") or {}), "healthProbeBindAddress": f"127.0.0.1:{health_port}"}
    cfg["metrics"] = {**(cfg.get("metrics") or {}), "bindAddress": "0"}
    cfg["webhook"] = {**(cfg.get("webhook") or {}), "host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)}
    cfg["leaderElection"] = {**(cfg.get("leaderElection") or {}), "leaderElect": True, "resourceNamespace": NAMESPACE}
    cfg["internalCertManagement"] = {"enable": False}
    cfg["integrations"] = {**(cfg.get("integrations") or {}), "frameworks": list(FRAMEWORKS)}
    cfg["featureGates"] = dict(FEATURE_GATES)
    cfg.pop("pprofBindAddress", None)
    return cfg


def _served(hook: dict[str, Any]) -> bool:
    """Whether a webhook from the module's manifest belongs to Kueue's own kinds or an enabled job
    integration (a framework name is ``<group>/<kind>``, the rule's resource its plural)."""
    for rule in hook.get("rules") or []:
        for group in rule.get("apiGroups") or []:
            if group == KUEUE_GROUP:
                return True
            for resource in rule.get("resources") or []:
                if group and f"{group}/{resource.removesuffix('s')}" in FRAMEWORKS:
                    return True
    return False


def webhook_configurations(manifests: Sequence[dict[str, Any]], port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """The module's webhook configurations pointed at Kueue on ``127.0.0.1:port`` with ``ca_pem``."""
    import base64

    bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in manifests:
        if not doc or doc.get("kind") not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"] = {"name": WEBHOOK_PREFIX + doc["metadata"]["name"]}
        hooks = []
        for hook in doc.get("webhooks") or []:
            if not _served(hook):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
            hooks.append(hook)
        doc["webhooks"] = hooks
        out.append(doc)
    return out


def _wrapper(state: State, kueue: Path, cfg: Path, kubeconfig: Path, cert: Path, key: Path) -> list[str]:
    """argv that runs Kueue with ``/etc/kueue/metrics/certs`` provided in a private mount namespace."""
    mnt = state.dir / "kueue" / "etc-overlay"
    mnt.mkdir(parents=True, exist_ok=True)
    unshare = shutil.which("unshare")
    if unshare is None:
        raise TestbedError(
            "kueue",
            "`unshare` (util-linux) not found: needed to give Kueue its "
            "/etc/kueue/metrics/certs without writing to the host's /etc",
        )
    script = (
        'set -e; m="$1"; mount -t tmpfs -o size=1m,mode=0755 kueue-etc "$m"; '
        'mkdir -p "$m/upper/kueue/metrics/certs" "$m/work"; '
        'cp "$2" "$m/upper/kueue/metrics/certs/tls.crt"; cp "$3" "$m/upper/kueue/metrics/certs/tls.key"; '
        'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$m/upper,workdir=$m/work" /etc; '
        'exec "$4" --config="$5" --kubeconfig="$6"'
    )
    # root: a mount namespace is enough; otherwise a user namespace that maps us to root in it
    ns_flags = ["-m"] if os.geteuid() == 0 else ["-r", "-m"]
    return [
        unshare,
        *ns_flags,
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "kueue-testbed",
        str(mnt),
        str(cert),
        str(key),
        str(kueue),
        str(cfg),
        str(kubeconfig),
    ]


def start(
    state: State,
    kueue_bin: Path,
    pki: Pki,
    kubeconfig: Path,
    api_url: str,
    kubectl: Path,
    base_config: Path,
    webhook_manifests: Path,
) -> None:
    """Start Kueue, wait for ``/readyz``, register its webhooks and wait until they answer."""
    session = _session(pki)
    _ensure_namespace(session, api_url)
    base = yaml.safe_load(base_config.read_text())
    kdir = state.dir / "kueue"
    cert_dir = kdir / "webhook-certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pki.kueue_webhook_cert, cert_dir / "tls.crt")
    shutil.copyfile(pki.kueue_webhook_key, cert_dir / "tls.key")
    os.chmod(cert_dir / "tls.key", 0o600)
    cfg_path = kdir / "config.yaml"

    def argv(p: dict[str, int]) -> Sequence[str]:
        cfg = configuration(base, health_port=p["health"], webhook_port=p["webhook"], cert_dir=cert_dir)
        cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return _wrapper(state, kueue_bin, cfg_path, kubeconfig, cert_dir / "tls.crt", cert_dir / "tls.key")

    def ready(p: dict[str, int]) -> Callable[[], bool]:
        return lambda: process.local_get(f"http://127.0.0.1:{p['health']}/readyz", timeout=3).status_code == 200

    proc, secs = launch(state, "kueue", argv, ready, ports=("health", "webhook"), marker=str(cfg_path), timeout=120)
    state.set(
        kueue_health_url=f"http://127.0.0.1:{proc.ports['health']}",
        kueue_namespace=NAMESPACE,
        kueue_webhook_port=proc.ports["webhook"],
    )
    hooks = webhook_configurations(
        list(yaml.safe_load_all(webhook_manifests.read_text())), proc.ports["webhook"], pki.serving_ca.read_bytes()
    )
    manifest = kdir / "webhooks.yaml"
    manifest.write_text(yaml.safe_dump_all(hooks, sort_keys=False))
    log = log_path(state, "kueue-webhooks")
    with open(log, "ab") as out:
        rc = subprocess.run(
            [
                str(kubectl),
                f"--kubeconfig={kubeconfig}",
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=gpu-auditor-testbed",
                "-f",
                str(manifest),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        ).returncode
    if rc:
        raise TestbedError("kueue webhooks", f"kubectl apply exited with code {rc}", log)
    waited = process.wait_ready(
        "kueue webhooks", proc.pid, lambda: _webhooks_answer(session, api_url), log_path(state, "kueue"), timeout=60
    )
    served = sum(len(h["webhooks"]) for h in hooks)
    _say(
        f"kueue {config.KUEUE_VERSION} ready ({secs:.1f} s), {served} webhooks on 127.0.0.1:"
        f"{proc.ports['webhook']} answering ({waited:.1f} s)"
    )


def _ensure_namespace(session: requests.Session, api_url: str) -> None:
    r = session.post(
        f"{api_url}/api/v1/namespaces",
        json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        timeout=30,
    )
    if r.status_code not in (201, 409):
        raise TestbedError("kueue", f"cannot create namespace {NAMESPACE}: {r.status_code} {r.text[:200]}")


def _webhooks_answer(session: requests.Session, api_url: str) -> bool:
    """A dry-run ResourceFlavor create passes Kueue's mutating and validating webhooks end to end."""
    body = {
        "apiVersion": f"{KUEUE_GROUP}/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "testbed-webhook-probe"},
    }
    r = session.post(
        f"{api_url}/apis/{KUEUE_GROUP}/v1beta2/resourceflavors", params={"dryRun": "All"}, json=body, timeout=10
    )
    return r.status_code in (200, 201)


def healthy(state: State) -> bool:
    url = state.values.get("kueue_health_url")
    if not url:
        return False
    try:
        return process.local_get(f"{url}/readyz", timeout=3).status_code == 200
    except requests.RequestException:
        return False
