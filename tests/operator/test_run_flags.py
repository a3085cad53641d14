"""Server-free parts of ``run``'s Lease and dry-run flags (issue 12, items 1 and 2).

Where the Lease's namespace comes from, how an apiserver's refusal reads, the flags as
settings, and the read-only client of a dry run. The behaviour against the real apiserver is in
test_run_safety.py.
"""

from __future__ import annotations

import argparse
import json

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from auditor.cli import run as run_cli
from auditor.kube import lease
from auditor.kube.client import WriteRefused, read_only
from auditor.settings import load_settings


def _kubeconfig(tmp_path, contexts: dict[str, str | None], current: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": current,
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": n, "context": {"cluster": "c", "user": "u", **({"namespace": ns} if ns else {})}}
                    for n, ns in contexts.items()
                ],
            }
        )
    )
    return str(path)


def test_lease_namespace_outside_a_cluster_is_the_kubeconfig_contexts(tmp_path):
    kc = _kubeconfig(tmp_path, {"admin": "team-a", "bare": None}, current="admin")
    assert lease.lease_namespace(None, in_cluster=False, kubeconfig=kc, environ={}) == (
        "team-a",
        "the kubeconfig context 'admin'",
    )
    # an explicit context is the one read, as kubectl --context does
    assert lease.lease_namespace(None, in_cluster=False, kubeconfig=kc, context="bare", environ={}) == (
        "default",
        "the kubeconfig context 'bare', which names no namespace",
    )
    # the setting and $POD_NAMESPACE win over the kubeconfig
    assert lease.lease_namespace("ops", in_cluster=False, kubeconfig=kc, environ={"POD_NAMESPACE": "x"})[0] == "ops"
    assert lease.lease_namespace(None, in_cluster=False, kubeconfig=kc, environ={"POD_NAMESPACE": "x"}) == (
        "x",
        "$POD_NAMESPACE",
    )


def test_lease_namespace_in_a_pod_is_its_service_accounts(tmp_path, monkeypatch):
    sa = tmp_path / "namespace"
    sa.write_text("gpu-ops\n")
    monkeypatch.setattr(lease, "SERVICE_ACCOUNT_NAMESPACE", str(sa))
    assert lease.lease_namespace(None, in_cluster=True, environ={}) == ("gpu-ops", "the pod's service account")
    monkeypatch.setattr(lease, "SERVICE_ACCOUNT_NAMESPACE", str(tmp_path / "absent"))
    assert lease.lease_namespace(None, in_cluster=True, environ={})[0] == "gpu-auditor"


def _status(code: int, reason: str, message: str, kind: str) -> ApiException:
    exc = ApiException(status=code, reason=reason)
    exc.body = json.dumps(
        {
            "kind": "Status",
            "status": "Failure",
            "message": message,
            "reason": reason,
            "details": {"name": "x", "kind": kind},
            "code": code,
        }
    )
    return exc


def test_a_missing_namespace_is_told_from_a_missing_lease():
    assert lease._namespace_missing(_status(404, "NotFound", 'namespaces "x" not found', "namespaces"))
    assert not lease._namespace_missing(_status(404, "NotFound", 'leases.coordination.k8s.io "x" not found', "leases"))
    assert not lease._namespace_missing(_status(403, "Forbidden", "no", "leases"))
    # one line with the server's message, never the raw body and headers
    assert lease._why(_status(404, "NotFound", 'namespaces "x" not found', "namespaces")) == (
        '404 NotFound: namespaces "x" not found'
    )


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    run_cli.register(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def test_lease_flags_are_settings():
    s = load_settings(
        None,
        overrides=run_cli.overrides_from_args(_args("--no-leader-election", "--lease-namespace", "ops")),
        environ={},
    )
    assert (s.leader_election.enabled, s.leader_election.namespace) == (False, "ops")
    s = load_settings(None, overrides=run_cli.overrides_from_args(_args()), environ={})
    assert (s.leader_election.enabled, s.leader_election.namespace) == (True, None)
    assert _args("--dry-run", "--once").dry_run is True


def test_a_read_only_client_refuses_every_write_before_sending_it():
    conf = client.Configuration()
    conf.host = "https://127.0.0.1:1"  # nothing listens: a request that got out would fail differently
    api = read_only(client.ApiClient(conf))
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        with pytest.raises(WriteRefused, match=f"dry run: refused {method} /api/v1/namespaces/n/pods/p"):
            api.call_api(method, "https://127.0.0.1:1/api/v1/namespaces/n/pods/p?x=1")
