"""helm post-renderer for the bed's node: what a real cluster's plumbing would add to the chart's pods.

The bed has no kube-proxy and no pod network to its loopback-only servers (apiserver,
Prometheus, PostgreSQL), and its apiserver runs without the ServiceAccount admission plugin.
So each pod template of the rendered chart gets, and nothing else changes:

- ``hostNetwork: true`` (so 127.0.0.1 is the host's), ``dnsPolicy: ClusterFirstWithHostNet``;
- ``KUBERNETES_SERVICE_HOST/PORT`` naming the apiserver on 127.0.0.1 (what the ``kubernetes``
  Service would route to);
- the ``kube-api-access`` projected volume the ServiceAccount admission plugin would add (token,
  ``kube-root-ca.crt``, namespace), filled by the kubelet through the TokenRequest API;
- ``schedulerName`` of the node tests' own scheduler, and a toleration of the node's taint.

Usage (helm passes the rendered manifests on stdin): ``postrender.py '<json: apiserver_port, scheduler>'``.
"""

from __future__ import annotations

import json
import sys

import yaml

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TAINT_KEY = "gpu-auditor.io/testbed-node"


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


def adapt(doc: dict, apiserver_port: int, scheduler: str) -> dict:
    if doc.get("kind") not in ("Deployment", "DaemonSet"):
        return doc
    spec = doc["spec"]["template"]["spec"]
    spec["hostNetwork"] = True
    spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    spec["schedulerName"] = scheduler
    spec.setdefault("tolerations", []).append({"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
    mount_token = spec.get("automountServiceAccountToken", True)
    if mount_token:
        spec.setdefault("volumes", []).append(_api_access_volume())
    for c in spec["containers"]:
        c.setdefault("env", []).extend(
            [
                {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(apiserver_port)},
            ]
        )
        if mount_token:
            c.setdefault("volumeMounts", []).append(
                {"name": "kube-api-access", "mountPath": TOKEN_DIR, "readOnly": True}
            )
    return doc


def main() -> int:
    opts = json.loads(sys.argv[1])
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    out = [adapt(d, int(opts["apiserver_port"]), opts["scheduler"]) for d in docs]
    sys.stdout.write(yaml.safe_dump_all(out, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
