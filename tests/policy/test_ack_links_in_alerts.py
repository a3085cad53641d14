"""Alerts carry a signed link that acknowledges the job's lineage (issue 16 item 7): the link in the
real Slack and webhook payloads, redeemed on the operator's real HTTP server, recorded in the store."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qsl, urlsplit

import pytest
from policy_receivers import Receiver
from test_unrouted_alerts import FAST, POLICY

from auditor.core.acklink import LinkIssuer, verify
from auditor.core.job_summary import JobSummary
from auditor.core.lineage import LineageKey
from auditor.core.model import JobRef
from auditor.operator_loop.ack_endpoint import PATH, AckEndpoint
from auditor.operator_loop.health import HealthServer, OperatorMetrics
from auditor.policy.config import link_issuer
from auditor.policy.loader import parse_policies
from auditor.policy.runner import PolicyRunner, Route, RunnerConfig
from auditor.settings import Settings
from auditor.store import Store
from auditor.store.lineage import AckLog

T0 = datetime(2026, 11, 24, 10, 0, tzinfo=timezone.utc)
SECRET = b"sixteen-bytes-at-least-key"
SUMMARY = {
    "cluster": "c1",
    "namespace": "ml",
    "job": "Job/train-7f9c2",
    "team": "vision",
    "verdict": "low_sm_efficiency",
    "sm_active": 0.04,
    "gpu_util": 1.0,
    "coverage": 1.0,
    "start": (T0 - timedelta(hours=2)).isoformat(),
    "end": T0.isoformat(),
    "kube": {"lineage": None},
}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.testbed)])
def db(request: pytest.FixtureRequest, tmp_path) -> str:
    return f"sqlite:///{tmp_path}/s.db" if request.param == "sqlite" else request.getfixturevalue("postgres_url")


def test_the_alerts_link_acknowledges_the_jobs_lineage_once(db: str) -> None:
    slack, hook = Receiver(), Receiver()
    store = Store.open(db)
    clock = {"now": T0}
    server = HealthServer(
        "127.0.0.1",
        0,
        metrics=OperatorMetrics(),
        healthy=lambda: (True, ""),
        ready=lambda: (True, ""),
        routes={PATH: AckEndpoint(AckLog(store), SECRET, cluster="c1", clock=lambda: clock["now"]).handle},
    ).start()
    try:
        store.upsert_job(JobRef("c1", "ml", "Job", "train-7f9c2", None, "vision"), T0 - timedelta(hours=2), T0)
        issuer = LinkIssuer(SECRET, f"http://127.0.0.1:{server.port}", timedelta(days=7), timedelta(days=30))
        config = RunnerConfig(
            cluster="c1",
            default_route=Route(slack_url=slack.url, webhook_url=hook.url, webhook_secret="s"),
            retry=FAST,
            ack_links=issuer,
        )
        PolicyRunner(parse_policies(POLICY, "p.yaml"), store, None, config).run_cycle(
            [JobSummary.example(**SUMMARY)], now=T0, act=True
        )
        [s], [h] = slack.accepted, hook.accepted
        buttons = s.json()["blocks"][-1]
        assert buttons["type"] == "actions"
        snooze, button = buttons["elements"]  # issue 30: the job's snooze first, then the gate's acknowledgement
        assert snooze["text"]["text"] == "Snooze this job's escalation for 24 h"
        assert button["text"]["text"] == "Acknowledge for re-submission (gate)"
        url = button["url"]
        data = h.json()["data"]
        assert data["lineage"] == "ml/train" and data["ack_url"].startswith(f"http://127.0.0.1:{server.port}/gate/ack?")
        assert data["snooze_url"] == snooze["url"] and data["snooze_for_s"] == 86400
        link = verify(dict(parse_qsl(urlsplit(url).query)), SECRET, T0)
        assert (link.key, link.to, link.until, link.expires) == (
            LineageKey("c1", "ml", "train"),
            "team:vision",
            T0 + timedelta(days=30),
            T0 + timedelta(days=7),
        )
        # one alert, one link: both payloads carry the same; clicked (GET confirms), then confirmed (POST)
        assert data["ack_url"] == url
        clock["now"] = T0 + timedelta(hours=3)
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200 and b'<form method="post"' in r.read()
        form = urllib.parse.urlencode(dict(parse_qsl(urlsplit(url).query))).encode()
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{server.port}{PATH}", data=form)) as r:
            assert r.status == 200
        [ack] = AckLog(store).acks(LineageKey("c1", "ml", "train"))
        assert (ack.by, ack.via, ack.at) == ("link:team:vision", "link", T0 + timedelta(hours=3))
        with pytest.raises(urllib.error.HTTPError) as again:
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{server.port}{PATH}", data=form))
        assert again.value.code == 409
    finally:
        server.stop()
        store.close()
        slack.close()
        hook.close()


def test_without_a_key_alerts_carry_no_link_and_the_settings_build_the_issuer(tmp_path) -> None:
    slack = Receiver()
    store = Store.open(f"sqlite:///{tmp_path}/s.db")
    try:
        config = RunnerConfig(cluster="c1", default_route=Route(slack_url=slack.url), retry=FAST)
        PolicyRunner(parse_policies(POLICY, "p.yaml"), store, None, config).run_cycle(
            [JobSummary.example(**SUMMARY)], now=T0, act=True
        )
        [s] = slack.accepted
        assert all(b["type"] != "actions" for b in s.json()["blocks"])
    finally:
        store.close()
        slack.close()
    key = tmp_path / "key"
    key.write_bytes(SECRET + b"\n")
    assert link_issuer(Settings()) is None
    gate = {"ack_link_key_file": str(key), "ack_link_base_url": "https://auditor.example.com"}
    assert link_issuer(Settings(gate={**gate})) == LinkIssuer(
        SECRET, "https://auditor.example.com", timedelta(days=7), timedelta(days=30), timedelta(hours=24)
    )
    assert link_issuer(Settings(gate={**gate, "ack_link_snooze": "2h"})).snooze == timedelta(hours=2)  # type: ignore[union-attr]
    assert link_issuer(Settings(gate={**gate, "ack_link_until": None})).until is None  # type: ignore[union-attr]
