"""``run`` without surprises, on the test bed's real apiserver (issue 12, items 1 and 2).

Item 1: a Lease namespace that does not exist is said at once, with what to do, never as
"another operator holds the Lease"; outside a cluster the Lease lives in the kubeconfig
context's namespace; ``--no-leader-election`` runs a cycle without any Lease; a holder is named
only when a real Lease names it.

Item 2: ``run --once --dry-run`` decides like the operator (an enforce policy whose first step
annotates, sends an Event and a Slack alert, whose second requeues) and records would-do
decisions, but the job, its pod and its Kueue Workload are unchanged, no Event exists, no
Lease was taken and nothing reached Slack — run as the admin, so every write would have been
allowed. A real cycle afterwards still carries out the first step: the dry run took no dedup key.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from kubeobjects import batch_job, create, create_pod
from kubernetes.client.rest import ApiException
from kueue_objects import job_workload
from policy.policy_receivers import Receiver  # tests/ is on sys.path (its conftest.py)
from test_operator_as_chart_sa import POLICY  # enforce: annotate, event, notify; then requeue
from test_operator_e2e import grant_chart_permissions

from auditor import traces
from auditor.actions.kube import REPORTING_CONTROLLER
from auditor.cli.main import main
from auditor.core.model import PodRef
from auditor.kube.client import call_json, resource_path
from auditor.store import Store
from auditor.store.decisions import DecisionStore

pytestmark = pytest.mark.testbed

INTERVAL = timedelta(seconds=15)
KV = "kueue.x-k8s.io/v1beta2"
LEASES = "coordination.k8s.io/v1"


def _kubeconfig(testbed, tmp_path: Path, namespace: str | None) -> str:
    """The test bed's admin kubeconfig with its current context set to ``namespace``."""
    doc = yaml.safe_load(Path(testbed.kubeconfig).read_text())
    for ctx in doc["contexts"]:
        if ctx["name"] == doc["current-context"]:
            ctx["context"].pop("namespace", None)
            if namespace:
                ctx["context"]["namespace"] = namespace
    path = tmp_path / f"kubeconfig-{uuid.uuid4().hex[:6]}"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _settings(tmp_path: Path, kubeconfig: str, prometheus_url: str, case: str, store_url: str, **extra) -> Path:
    cfg = tmp_path / f"settings-{uuid.uuid4().hex[:6]}.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "cluster": "test",
                "kubernetes": {"kubeconfig": kubeconfig},
                "prometheus": {"url": prometheus_url, "matchers": {"case": case}, "label_convention": "pod"},
                "store": {"url": store_url},
                "policies": {"builtin": False},
                # no weekly report: what a cycle sends must not depend on the day it runs
                "reports": {"weekly_schedule": ""},
                "http": {"port": 0},
                **extra,
            }
        )
    )
    return cfg


def _run(capsys, *argv: str) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    rc = main(["run", "--once", *argv])
    took = time.monotonic() - t0
    out = capsys.readouterr()
    return rc, out.out, out.err, took


def _run_loop(capsys, *argv: str) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    rc = main(["run", *argv])
    took = time.monotonic() - t0
    out = capsys.readouterr()
    return rc, out.out, out.err, took


def _lease(api, namespace: str, name: str = "gpu-auditor") -> dict | None:
    try:
        return call_json(api, resource_path(LEASES, "leases", namespace, name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


# ---------------------------------------------------------------------------------------- item 1


def test_a_missing_lease_namespace_is_said_at_once(testbed, kube_admin, prometheus, tmp_path, capsys, caplog):
    """The defect: ~20 s of retries, a raw 404 body, "another operator holds the Lease … (?)", exit 1."""
    case = f"ln{uuid.uuid4().hex[:8]}"
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    store = f"sqlite:///{tmp_path / 'store.db'}"
    # the default lease timings (15 s lease: acquire would have retried for 19 s)
    cfg = _settings(tmp_path, _kubeconfig(testbed, tmp_path, missing), prometheus.url, case, store)
    rc, _out, err, took = _run(capsys, "--config", str(cfg))
    assert rc == 2, err
    ctx = yaml.safe_load(Path(testbed.kubeconfig).read_text())["current-context"]
    assert f"the Lease's namespace '{missing}' (from the kubeconfig context '{ctx}') does not exist" in err, err
    assert f"kubectl create namespace {missing}" in err and "--lease-namespace" in err and "--no-leader-election" in err
    logs = err + caplog.text
    assert "holds the Lease" not in logs and "HTTP response body" not in logs and "(?)" not in logs, logs
    assert took < 10, f"took {took:.1f} s: a permanent 404 must not be retried for a lease duration"

    # the loop stops as fast, with the same message
    rc, _out, err, took = _run_loop(capsys, "--config", str(cfg))
    assert rc == 2 and f"the Lease's namespace '{missing}'" in err and took < 10, (took, err)

    # the flag names the namespace too, and the message says where it came from
    rc, _out, err, _took = _run(capsys, "--config", str(cfg), "--lease-namespace", missing + "-x")
    assert rc == 2 and f"'{missing}-x' (from leader_election.namespace) does not exist" in err, err

    # without leader election the cycle runs, and no Lease (nor its namespace) appears
    rc, _out, err, _took = _run(capsys, "--config", str(cfg), "--no-leader-election")
    assert rc == 0, err
    assert "cycle " in err and "Lease" not in err, err
    with pytest.raises(ApiException) as gone:
        call_json(kube_admin, resource_path("v1", "namespaces", None, missing))
    assert gone.value.status == 404


def test_the_lease_is_taken_in_the_kubeconfig_contexts_namespace(
    testbed, kube_admin, namespace, prometheus, tmp_path, capsys
):
    case = f"ln{uuid.uuid4().hex[:8]}"
    cfg = _settings(
        tmp_path, _kubeconfig(testbed, tmp_path, namespace), prometheus.url, case, f"sqlite:///{tmp_path / 'store.db'}"
    )
    assert _lease(kube_admin, namespace) is None
    rc, _out, err, _took = _run(capsys, "--config", str(cfg))
    assert rc == 0, err
    lease = _lease(kube_admin, namespace)
    assert lease is not None, "no Lease in the context's namespace"
    assert lease["spec"]["leaseTransitions"] == 0 and not lease["spec"].get("holderIdentity")  # taken, then released


def test_only_a_real_holder_is_named(testbed, kube_admin, namespace, prometheus, tmp_path, capsys):
    case = f"ln{uuid.uuid4().hex[:8]}"
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    create(
        kube_admin,
        LEASES,
        "leases",
        namespace,
        {
            "apiVersion": LEASES,
            "kind": "Lease",
            "metadata": {"name": "gpu-auditor"},
            "spec": {
                "holderIdentity": "gpu-auditor-7c9f-abcde",
                "leaseDurationSeconds": 3600,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 3,
            },
        },
    )
    cfg = _settings(
        tmp_path,
        _kubeconfig(testbed, tmp_path, namespace),
        prometheus.url,
        case,
        f"sqlite:///{tmp_path / 'store.db'}",
        leader_election={"lease_duration": "2s", "renew_deadline": "1500ms", "retry_period": "500ms"},
    )
    rc, _out, err, _took = _run(capsys, "--config", str(cfg))
    assert rc == 1, err
    assert f"another operator (gpu-auditor-7c9f-abcde) holds the Lease {namespace}/gpu-auditor" in err, err
    assert _lease(kube_admin, namespace)["spec"]["holderIdentity"] == "gpu-auditor-7c9f-abcde"  # untouched


def test_a_refused_lease_is_said_at_once(testbed, kube_admin, namespace, prometheus, tmp_path, capsys):
    """The chart's rules name another Lease: this one may be neither read nor updated (403)."""
    case = f"ln{uuid.uuid4().hex[:8]}"
    cleanup = grant_chart_permissions(kube_admin, namespace, "gpu-auditor", "another-lease", {"kueueRead"})
    try:
        cfg = _settings(
            tmp_path,
            _kubeconfig(testbed, tmp_path, namespace),
            prometheus.url,
            case,
            f"sqlite:///{tmp_path / 'store.db'}",
            kubernetes={
                "kubeconfig": testbed.kubeconfig,
                "impersonate": f"system:serviceaccount:{namespace}:gpu-auditor",
            },
            leader_election={"namespace": namespace},
        )
        rc, _out, err, took = _run(capsys, "--config", str(cfg))
    finally:
        for path in cleanup:
            call_json(kube_admin, path, method="DELETE")
    assert rc == 1, err
    assert f"not allowed to get the Lease {namespace}/gpu-auditor: 403 Forbidden" in err, err
    assert "holds the Lease" not in err and took < 10, (took, err)


# ---------------------------------------------------------------------------------------- item 2


def _spinning_job(api, prometheus, ns: str, case: str, end: datetime | None = None) -> dict:
    """A Kueue-managed Job (active Workload) whose one GPU spins one SM: low_sm_efficiency.
    Its samples end at ``end`` (default: two minutes from now, a job still running)."""
    create(
        api,
        KV,
        "localqueues",
        ns,
        {"apiVersion": KV, "kind": "LocalQueue", "metadata": {"name": "lq"}, "spec": {"clusterQueue": f"cq-{case}"}},
    )
    job = batch_job(api, ns, "train", labels={"kueue.x-k8s.io/queue-name": "lq"})
    job_workload(api, ns, job)  # Kueue's own Workload of the queued Job
    trace = traces.load_trace("h200-microbench")
    cycle = len(trace.steady("one_sm_spin")) * INTERVAL
    duration = cycle * math.ceil(timedelta(minutes=30) / cycle)
    end = end or datetime.now(timezone.utc).replace(microsecond=0) + timedelta(minutes=2)
    create_pod(api, ns, "train-0-abcde", gpus=1, owner=job, node=f"{case}-node", started=end - duration)
    tj = traces.TraceJob(
        PodRef(ns, "train-0-abcde", "main"), traces.make_gpus(1, f"{case}-node"), "one_sm_spin", duration=duration
    )
    text = traces.trace_to_openmetrics(trace, [tj], end=end, duration=duration, interval=INTERVAL)
    prometheus.backfill(re.sub(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{", rf'\1{{case="{case}",', text, flags=re.M))
    return job


def _cluster_state(api, ns: str) -> dict:
    """What an acting cycle would change: annotations, our Events, the Workload, the Lease."""
    job = call_json(api, resource_path("batch/v1", "jobs", ns, "train"))
    pod = call_json(api, resource_path("v1", "pods", ns, "train-0-abcde"))
    wl = job_workload(api, ns, job)
    events = call_json(api, resource_path("events.k8s.io/v1", "events", ns))["items"]
    return {
        "job_annotations": {
            k: v for k, v in (job["metadata"].get("annotations") or {}).items() if k.startswith("gpu-auditor.io/")
        },
        "pod_annotations": {
            k: v for k, v in (pod["metadata"].get("annotations") or {}).items() if k.startswith("gpu-auditor.io/")
        },
        "job_version": job["metadata"]["resourceVersion"],
        "workload_active": wl["spec"].get("active"),
        "workload_priority": wl["spec"].get("priority"),
        "our_events": [e["metadata"]["name"] for e in events if e.get("reportingController") == REPORTING_CONTROLLER],
        "lease": _lease(api, ns),
    }


def test_dry_run_decides_and_records_but_changes_nothing(
    testbed, kube_admin, namespace, prometheus, postgres_url, tmp_path, capsys, monkeypatch
):
    api, ns = kube_admin, namespace
    case = f"dr{uuid.uuid4().hex[:8]}"
    _spinning_job(api, prometheus, ns, case)
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "requeue.yaml").write_text(POLICY)
    slack = Receiver()
    try:
        monkeypatch.setenv("GPU_AUDITOR_SLACK_WEBHOOK_URL", slack.url)
        cfg = _settings(
            tmp_path,
            _kubeconfig(testbed, tmp_path, ns),
            prometheus.url,
            case,
            postgres_url,
            policies={"builtin": False, "dir": str(policies)},
            features={"annotate": True, "events": True, "kueue": True, "requeue": True},
            requeue={"namespaces": [ns]},
            notifications={"slack": {"webhook_url_env": "GPU_AUDITOR_SLACK_WEBHOOK_URL"}},
            leader_election={"lease_duration": "6s", "renew_deadline": "4s", "retry_period": "1s"},
        )
        before = _cluster_state(api, ns)
        assert before["job_annotations"] == {} and before["our_events"] == [] and before["workload_active"] is True
        assert before["lease"] is None

        for _ in range(2):  # twice: a repeated dry run records its would-do decision once
            rc, out, err, _took = _run(capsys, "--config", str(cfg), "--dry-run", "--output", "json")
            assert rc == 0, err
            (summary,) = [s for s in json.loads(out) if s["namespace"] == ns]
            assert (summary["job"], summary["verdict"]) == ("Job/train", "low_sm_efficiency")
            (decision,) = summary["policy_decisions"]
            assert (decision["policy"], decision["step"], decision["actions"], decision["dry_run"]) == (
                "requeue-low-sm",
                0,
                ["annotate", "event", "notify"],
                True,
            )
            assert "(dry-run)" in err and "dry run: nothing was written to the cluster" in err, err
            assert _cluster_state(api, ns) == before
        assert slack.requests == []

        store = Store.open(postgres_url)
        try:
            repo = DecisionStore(store)
            (row,) = repo.decisions()
            assert (row["policy"], row["step"], row["actions"], row["dry_run"], row["violation_id"]) == (
                "requeue-low-sm",
                0,
                ["annotate", "event", "notify"],
                True,
                None,
            )
            assert row["dedup_key"].startswith("dry-run:") and row["evidence"]["would_do"] is True
            assert repo.actions() == [] and repo.open_violations() == []  # no ladder moved, no key taken
            runs = [r for r in store.runs() if (r["detail"] or {}).get("origin") == "operator"]
            assert len(runs) == 2 and all(r["detail"].get("dry_run") is True for r in runs)
        finally:
            store.close()

        # the acting operator is not held back by what the dry run recorded
        rc, out, err, _took = _run(capsys, "--config", str(cfg), "--output", "json")
        assert rc == 0, err
        after = _cluster_state(api, ns)
        assert after["job_annotations"]["gpu-auditor.io/verdict"] == "low_sm_efficiency"
        assert len(after["our_events"]) == 1 and len(slack.accepted) == 1
        assert after["workload_active"] is True  # the requeue is the next step
        assert after["lease"] is not None and not after["lease"]["spec"].get("holderIdentity")
    finally:
        slack.close()


def test_every_now_of_a_cycle_is_the_operators_clock(
    testbed, kube_admin, namespace, prometheus, postgres_url, tmp_path
):
    """``Operator(clock=…)``: the cycle's window, its recorded run and the policy decisions all
    take their "now" from the clock, not from the wall (the data sits hours back from the wall
    only because Prometheus must hold it)."""
    from auditor.operator_loop import Operator
    from auditor.settings import load_settings

    case = f"ck{uuid.uuid4().hex[:8]}"
    t = datetime.fromtimestamp(int(time.time()) // 300 * 300 - 3 * 3600 + 61, timezone.utc)
    _spinning_job(kube_admin, prometheus, namespace, case, end=t)
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "requeue.yaml").write_text(POLICY)
    cfg = _settings(
        tmp_path,
        _kubeconfig(testbed, tmp_path, namespace),
        prometheus.url,
        case,
        postgres_url,
        policies={"builtin": False, "dir": str(policies)},
    )
    result = Operator(load_settings(cfg, environ={}), clock=lambda: t, dry_run=True).run_once()
    assert result.window.end == t
    (summary,) = [x.to_json() for x in result.summaries if x.namespace == namespace]
    assert summary["verdict"] == "low_sm_efficiency" and summary["end"] <= t.isoformat().replace("+00:00", "Z")
    store = Store.open(postgres_url)
    try:
        (run,) = store.runs()
        (row,) = DecisionStore(store).decisions()
    finally:
        store.close()
    assert run["window_end"] == t and run["detail"]["dry_run"] is True
    assert row["decided_at"] == t
