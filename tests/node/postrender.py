"""helm post-renderer for the bed's node: what a real cluster's plumbing would add to the chart's pods.

The bed has no kube-proxy and no pod network to its loopback-only servers (apiserver,
Prometheus, PostgreSQL), and its apiserver runs without the ServiceAccount admission plugin.
So each pod template of the rendered chart gets, and nothing else of the chart changes:

- ``hostNetwork: true`` (so 127.0.0.1 is the host's), ``dnsPolicy: ClusterFirstWithHostNet``;
- ``KUBERNETES_SERVICE_HOST/PORT`` naming the apiserver on 127.0.0.1 (what the ``kubernetes``
  Service would route to);
- the ``kube-api-access`` projected volume the ServiceAccount admission plugin would add (token,
  ``kube-root-ca.crt``, namespace), filled by the kubelet through the TokenRequest API; not where
  the chart says ``automountServiceAccountToken: false`` (the node agent);
- ``schedulerName`` of the node tests' own scheduler, and a toleration of the node's taint.

The node has no GPU, so the node agent's GPU source is replaced by the recorded sampler
(``auditor.agent.recorded``, replaying a trace recorded on an H200): the agent container runs
``LAUNCHER`` (a ConfigMap added to the release) with the chart's own arguments; the launcher
swaps ``open_sampler`` for a RecordedSampler over the device IDs the bed's device plugin
advertises and then runs ``gpu-auditor agent`` unchanged (pod attribution, exposition).

Usage (helm passes the rendered manifests on stdin): ``postrender.py '<json options>'`` with
``apiserver_port``, ``scheduler``, ``devices`` (the fake GPU IDs), ``trace`` and ``phase``.
"""

from __future__ import annotations

import json
import sys

import yaml

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TAINT_KEY = "gpu-auditor.io/testbed-node"
LAUNCHER_DIR = "/opt/testbed"

LAUNCHER = """\
import json, os, sys

from auditor import traces
from auditor.agent import recorded, sampler

ids = json.loads(os.environ["TESTBED_RECORDED_DEVICES"])
rows = recorded.trace_rows(traces.load_trace(os.environ["TESTBED_TRACE"]), os.environ["TESTBED_PHASE"])
devices = [sampler.Device(index=i, uuid=u, model="NVIDIA H200") for i, u in enumerate(ids)]
replay = recorded.RecordedSampler(devices, {d.key: rows for d in devices})
sampler.open_sampler = lambda *args, **kwargs: replay  # whatever the agent asks of its source

from auditor.cli.main import main

sys.exit(main(sys.argv[1:]))
"""


def _api_access_volume() -> dict:
    return {
        "name": "kube-api-access",
        "projected": {
            "defaultMode": 0o444,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ],
        },
    }


def _launcher_name(daemonset: dict) -> str:
    return f"{daemonset['metadata']['name']}-recorded"


def launcher_configmap(daemonset: dict) -> dict:
    meta = daemonset["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": _launcher_name(daemonset), "namespace": meta["namespace"], "labels": meta["labels"]},
        "data": {"recorded_agent.py": LAUNCHER},
    }


def _recorded_agent(daemonset: dict, spec: dict, opts: dict) -> None:
    spec.setdefault("volumes", []).append(
        {"name": "testbed-launcher", "configMap": {"name": _launcher_name(daemonset)}}
    )
    (c,) = spec["containers"]
    assert c["command"] == ["gpu-auditor"] and c["args"][0] == "agent", c  # the chart's agent command
    c["command"] = ["python3", f"{LAUNCHER_DIR}/recorded_agent.py"]
    c["env"] += [
        {"name": "TESTBED_RECORDED_DEVICES", "value": json.dumps(opts["devices"])},
        {"name": "TESTBED_TRACE", "value": opts["trace"]},
        {"name": "TESTBED_PHASE", "value": opts["phase"]},
    ]
    c["volumeMounts"].append({"name": "testbed-launcher", "mountPath": LAUNCHER_DIR, "readOnly": True})


def adapt(doc: dict, opts: dict) -> list[dict]:
    if doc.get("kind") not in ("Deployment", "DaemonSet"):
        return [doc]
    spec = doc["spec"]["template"]["spec"]
    spec["hostNetwork"] = True
    spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    spec["schedulerName"] = opts["scheduler"]
    spec.setdefault("tolerations", []).append({"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
    mount_token = spec.get("automountServiceAccountToken", True)
    if mount_token:
        spec.setdefault("volumes", []).append(_api_access_volume())
    for c in spec["containers"]:
        c.setdefault("env", []).extend(
            [
                {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(opts["apiserver_port"])},
            ]
        )
        if mount_token:
            c.setdefault("volumeMounts", []).append(
                {"name": "kube-api-access", "mountPath": TOKEN_DIR, "readOnly": True}
            )
    if doc["kind"] == "DaemonSet":
        _recorded_agent(doc, spec, opts)
        return [doc, launcher_configmap(doc)]
    return [doc]


def main() -> int:
    opts = json.loads(sys.argv[1])
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    out = [o for d in docs for o in adapt(d, opts)]
    sys.stdout.write(yaml.safe_dump_all(out, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
