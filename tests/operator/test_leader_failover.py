"""Two operator processes on one Lease: only the leader audits; a crashed leader is replaced
within the lease duration, a cleanly stopped one at once (it releases the Lease); no cycle's
work is done twice (the recorded cycle windows follow each other, never overlap, never run
concurrently). Real apiserver and PostgreSQL; short leases to measure the failover time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from auditor.kube.client import call_json, resource_path
from auditor.store import Store

pytestmark = pytest.mark.testbed

LEASE = 4.0
RETRY = 0.5
WIDTH = timedelta(minutes=1)


def _holder(api, ns: str, name: str) -> str | None:
    try:
        lease = call_json(api, resource_path("coordination.k8s.io/v1", "leases", ns, name))
    except Exception:  # noqa: BLE001 - not created yet
        return None
    return (lease.get("spec") or {}).get("holderIdentity")


def _wait_for(pred, timeout: float, step: float = 0.1) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(step)
    raise AssertionError(f"condition not met within {timeout} s")


def _start(cfg: Path, identity: str, log: Path) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("gpu-auditor")
    env = {**os.environ, "GPU_AUDITOR_LEADER_ELECTION__IDENTITY": identity}
    return subprocess.Popen([str(exe), "-v", "run", "--config", str(cfg)], env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def test_two_operators_one_leader_failover(testbed, kube_admin, namespace, prometheus, postgres_url, tmp_path):
    lease = f"lease-{uuid.uuid4().hex[:8]}"
    cfg = tmp_path / "settings.yaml"
    cfg.write_text(yaml.safe_dump({
        "cluster": f"failover-{namespace}",
        "kubernetes": {"kubeconfig": testbed.kubeconfig},
        "prometheus": {"url": prometheus.url, "matchers": {"case": f"none-{uuid.uuid4().hex}"}, "label_convention": "pod"},
        "store": {"url": postgres_url},
        "interval": "1s",
        "bucket_width": "1m",
        "leader_election": {"namespace": namespace, "lease_name": lease, "lease_duration": f"{LEASE:.0f}s",
                            "renew_deadline": "3s", "retry_period": f"{RETRY}s"},
        "features": {"kueue": False},
        "http": {"port": 0},
    }))
    procs: dict[str, subprocess.Popen] = {}
    figures: dict[str, float] = {}
    try:
        procs["a"] = _start(cfg, "op-a", tmp_path / "a.log")
        _wait_for(lambda: _holder(kube_admin, namespace, lease) == "op-a", 60)
        procs["b"] = _start(cfg, "op-b", tmp_path / "b.log")
        time.sleep(6)  # B is up and standing by; A keeps auditing
        assert _holder(kube_admin, namespace, lease) == "op-a"

        # crash the leader: no release, B must wait for the lease to expire
        os.killpg(procs["a"].pid, signal.SIGKILL)
        procs["a"].wait(10)
        figures["crash"] = _wait_for(lambda: _holder(kube_admin, namespace, lease) == "op-b", LEASE + 10)
        assert figures["crash"] <= LEASE + 2 * RETRY + 1.0, figures

        # a clean stop: B releases the Lease, C takes over at its next try
        procs["c"] = _start(cfg, "op-c", tmp_path / "c.log")
        time.sleep(6)
        assert _holder(kube_admin, namespace, lease) == "op-b"
        t0 = time.monotonic()
        os.killpg(procs["b"].pid, signal.SIGTERM)
        _wait_for(lambda: _holder(kube_admin, namespace, lease) == "op-c", LEASE + 10, step=0.05)
        figures["release"] = time.monotonic() - t0  # SIGTERM → the standby holds the Lease
        assert procs["b"].wait(30) == 0
        assert figures["release"] < LEASE, figures
        time.sleep(3)
        os.killpg(procs["c"].pid, signal.SIGTERM)
        assert procs["c"].wait(30) == 0
        assert not _holder(kube_admin, namespace, lease)  # released on the clean shutdown
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
    print(f"failover after a crash: {figures['crash']:.2f} s (lease {LEASE} s); after a clean stop: {figures['release']:.2f} s")

    with Store.open(postgres_url) as store:
        runs = [r for r in store.runs(limit=1000) if (r["detail"] or {}).get("origin") == "operator"]
    runs.sort(key=lambda r: r["started"])
    holders = [r["detail"]["holder"] for r in runs]
    assert {"op-a", "op-b", "op-c"} <= set(holders), holders
    # leadership moved a → b → c, never back, never interleaved
    order = [h for i, h in enumerate(holders) if i == 0 or holders[i - 1] != h]
    assert order == ["op-a", "op-b", "op-c"], order
    for prev, cur in zip(runs, runs[1:]):
        assert cur["started"] >= prev["finished"], "two cycles ran at the same time"
        # each window starts at the previous one's end, aligned down to its open bucket: no
        # work done twice beyond re-reading that one (idempotently replaced) bucket
        step = WIDTH.total_seconds()
        aligned = prev["window_end"].timestamp() // step * step
        assert cur["window_start"].timestamp() >= aligned, (prev, cur)
        assert all(r["status"].startswith("ok") for r in (prev, cur))
