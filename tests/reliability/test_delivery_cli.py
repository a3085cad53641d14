"""What ``gpu-auditor audit --policies --act`` says of an alert that did not go out (issue 20, Low:
"a failed alert printed as (acted)"; "a notification with no destination silently recorded as
skipped"): one clear line per alert and exit 1. Real Prometheus of the test bed (a backfilled
H200 trace), a real local receiver behind the fault proxy answering 500, no cluster."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import yaml
from faultproxy import Fault
from spin_backfill import backfill_spin

from auditor.cli.main import main
from auditor.core.model import PodRef

POLICY = {
    "apiVersion": "gpu-auditor.io/v1alpha1",
    "kind": "GpuPolicy",
    "metadata": {"name": "notify-low-sm"},
    "spec": {"mode": "warn", "verdicts": ["low_sm_efficiency"], "escalation": [{"actions": ["notify"]}]},
}


def test_a_failed_alert_and_an_unrouted_one_are_said_and_exit_1(
    prometheus, tmp_path, monkeypatch, capsys, fault_proxy, receiver
) -> None:
    case = f"cli{uuid.uuid4().hex[:8]}"
    end = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=1)
    duration = backfill_spin(prometheus, case, end=end, pod=PodRef("ml", "spin-0", "main"))
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "notify.yaml").write_text(yaml.safe_dump(POLICY))
    proxy = fault_proxy(receiver.url).always(Fault.status_code(500))
    for var in ("GPU_AUDITOR_WEBHOOK_URL", "GPU_AUDITOR_WEBHOOK_HMAC_KEY", "GPU_AUDITOR_WEBHOOK_SECRET"):
        monkeypatch.delenv(var, raising=False)
    argv = [
        "audit",
        "--prometheus",
        prometheus.url,
        "--no-kube",
        "--match",
        f"case={case}",
        "--start",
        (end - duration).isoformat(),
        "--end",
        end.isoformat(),
        "--policies",
        str(policies),
        "--act",
    ]

    monkeypatch.setenv("GPU_AUDITOR_SLACK_WEBHOOK_URL", proxy.url)
    rc = main([*argv, "--db", f"sqlite:///{tmp_path}/a.db"])
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("policy notify-low-sm")]
    assert rc == 1, err
    assert "(acted)" not in line and "notify failed: slack: HTTP 500" in line, line
    assert "policies: 1 decision(s) not carried out in full" in err
    assert len(proxy.requests) >= 2 and receiver.requests == []  # retried, never reached the receiver

    monkeypatch.delenv("GPU_AUDITOR_SLACK_WEBHOOK_URL")
    rc = main([*argv, "--db", f"sqlite:///{tmp_path}/b.db"])
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("policy notify-low-sm")]
    assert rc == 1, err
    assert "notify not delivered: no destination for team" in line, line
