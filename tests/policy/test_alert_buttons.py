"""What an alert with signed links says (issue 30), byte for byte: Slack's two buttons and the
context line that says what each does, and the webhook's ``snooze_url``, ``snooze_for_s`` and
``buttons``. Links are rendered from fixed URLs (the runner's carry random nonces), so the golden
files tests/golden/policy/*-with-links.json hold the words; the runner's own payloads are
tests/golden/test_golden.py's and tests/policy/test_ack_links_in_alerts.py's."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from auditor.core.action_target import ActionTarget
from auditor.core.job_summary import JobSummary
from auditor.policy.alerts import AlertLinks, slack_message, webhook_payload
from auditor.policy.loader import parse_policies
from tests.golden.test_golden import check

NOW = datetime(2026, 11, 25, 15, 0, tzinfo=timezone.utc)
POLICY = """apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {name: high-util-low-sm}
spec:
  mode: enforce
  verdicts: [low_sm_efficiency]
  escalation:
    - actions: [notify]
  advice: fuse kernels
"""
LINKS = AlertLinks(
    lineage="ml/train",
    ack_url="https://auditor.example.com/gate/ack?action=ack&sig=ACK",
    snooze_url="https://auditor.example.com/gate/ack?action=snooze&sig=SNOOZE",
    snooze_for=timedelta(hours=24),
)


def test_an_alert_with_links_says_which_button_does_what() -> None:
    (policy,) = parse_policies(POLICY, "p.yaml")
    s = JobSummary.example(
        cluster="c1", namespace="ml", job="Job/train-7f9c2", team="vision", verdict="low_sm_efficiency"
    )
    text, blocks = slack_message(policy, s, "low_sm_efficiency: sm_active=0.04 <= 0.3", links=LINKS)
    buttons = blocks[-1]["elements"]
    assert [b["text"]["text"] for b in buttons] == [
        "Snooze this job's escalation for 24 h",
        "Acknowledge for re-submission (gate)",
    ]
    assert [b["action_id"] for b in buttons] == ["gpu-auditor-snooze", "gpu-auditor-ack"]
    said = blocks[-2]["elements"][0]["text"]
    assert "*Snooze this job's escalation for 24 h* pauses this job's escalation" in said
    assert "the running job's escalation goes on" in said and "Silence" not in said
    check("policy/slack-with-links.json", json.dumps({"text": text, "blocks": blocks}, indent=2) + "\n")
    payload = webhook_payload(
        policy, ActionTarget.of_summary(s), "r", {}, "k#s0#notify", NOW, lineage="ml/train", links=LINKS
    )
    assert payload["snooze_for_s"] == 86400 and payload["ack_url"] == LINKS.ack_url
    check("policy/webhook-with-links.json", json.dumps(payload, indent=2) + "\n")
    plain = webhook_payload(policy, ActionTarget.of_summary(s), "r", {}, "k", NOW, lineage="ml/train", links=None)
    assert not {"ack_url", "snooze_url", "buttons", "lineage"} & set(plain)
