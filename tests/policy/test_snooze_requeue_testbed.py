"""On the test bed (issue 30): the alert's "Snooze this job's escalation" button stops the requeue
of a running Kueue job, and the ladder resumes when the snooze is over. Real apiserver and Kueue
(the job's Workload), a real Slack receiver, the operator's real HTTP server redeeming the link
from the alert, the snooze recorded in the bed's PostgreSQL store."""

from __future__ import annotations

import urllib.parse
import urllib.request
from datetime import timedelta
from urllib.parse import parse_qsl, urlsplit

import pytest
from test_policy_testbed import (  # noqa: F401  (fixtures)
    FAST,
    POLICY,
    SECRET,
    T0,
    _annotations,
    _job,
    _store_job,
    _summary,
    _wl,
    _workload,
    priority_class,
    receivers,
)

from auditor.actions import KubeActions
from auditor.core.acklink import LinkIssuer
from auditor.core.identity import JobKey
from auditor.operator_loop.ack_endpoint import PATH, AckEndpoint
from auditor.operator_loop.health import HealthServer, OperatorMetrics
from auditor.policy.loader import parse_policies
from auditor.policy.runner import PolicyRunner, RequeueSettings, Route, RunnerConfig
from auditor.store import Store
from auditor.store.lineage import AckLog

pytestmark = pytest.mark.testbed

LINK_KEY = b"a-link-key-of-sixteen-bytes-or-more"


def test_the_alerts_snooze_stops_the_requeue_until_it_ends(
    kube_admin,
    namespace,
    postgres_url,
    receivers,  # noqa: F811  (the fixture imported above)
    priority_class,  # noqa: F811
):
    slack, hook = receivers
    ns = namespace
    bad = _job(kube_admin, ns, "bad", kueue=True, priority_class=priority_class)
    wl = _workload(kube_admin, ns, "bad")
    store = Store.open(postgres_url)
    clock = {"now": T0}
    server = HealthServer(
        "127.0.0.1",
        0,
        metrics=OperatorMetrics(),
        healthy=lambda: (True, ""),
        ready=lambda: (True, ""),
        routes={
            PATH: AckEndpoint(
                AckLog(store), LINK_KEY, cluster="default", clock=lambda: clock["now"], snoozes=store.job_snoozes()
            ).handle
        },
    ).start()
    try:
        _store_job(store, ns, "bad", bad["uid"], bad["pod"], 0.97, 0.1)
        s = _summary(ns, "bad", bad["pod"], bad["uid"], "low_sm_efficiency", 0.97, 0.1)
        config = RunnerConfig(
            routes={"ml": Route(slack_url=slack.url, webhook_url=hook.url, webhook_secret=SECRET)},
            requeue=RequeueSettings(enabled=True, namespaces=frozenset({ns})),
            retry=FAST,
            ack_links=LinkIssuer(LINK_KEY, f"http://127.0.0.1:{server.port}", timedelta(days=7), timedelta(days=30)),
        )
        runner = PolicyRunner(parse_policies(POLICY, "p.yaml"), store, KubeActions(kube_admin, "test"), config)
        runner.run_cycle([s], now=T0, act=True)  # step 0: annotate, Event
        runner.run_cycle([s], now=T0 + timedelta(minutes=1), act=True)  # step 1: the alert
        [alert] = slack.accepted
        snooze, ack = alert.json()["blocks"][-1]["elements"]
        assert (snooze["text"]["text"], ack["text"]["text"]) == (
            "Snooze this job's escalation for 24 h",
            "Acknowledge for re-submission (gate)",
        )
        # the owner clicks (GET: a confirmation, nothing recorded), then confirms (POST)
        clock["now"] = T0 + timedelta(minutes=1, seconds=30)
        with urllib.request.urlopen(snooze["url"], timeout=10) as r:
            assert r.status == 200 and b"Snooze this job&#x27;s escalation for 24 h" in r.read()
        assert store.job_snoozes().of_job(JobKey("default", ns, "Job", "bad")) == []
        form = urllib.parse.urlencode(dict(parse_qsl(urlsplit(snooze["url"]).query))).encode()
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{server.port}{PATH}", data=form)) as r:
            assert r.status == 200
        until = clock["now"] + timedelta(hours=24)
        # without the snooze the requeue was due at minute 2; it is not taken while the snooze lasts
        for minutes in (2, 3, 10, 60, 24 * 60):
            (d,) = runner.run_cycle([s], now=T0 + timedelta(minutes=minutes), act=True)
            assert d.step is None and d.blocked and d.blocked.startswith("snoozed until"), d
        assert _wl(kube_admin, ns, wl)["spec"].get("active", True) is True
        assert "gpu-auditor.io/requeued-at" not in _annotations(kube_admin, ns, "bad")
        assert len(slack.accepted) == 1 and len(hook.accepted) == 1  # no alert again
        # the snooze is over: the ladder goes on with the requeue
        (d,) = runner.run_cycle([s], now=until, act=True)
        assert (d.step, d.actions) == (2, ["requeue"]), d
        assert _wl(kube_admin, ns, wl)["spec"]["active"] is False
        assert "gpu-auditor.io/requeued-at" in _annotations(kube_admin, ns, "bad")
    finally:
        server.stop()
        store.close()
