"""Policy core and notifiers without the test bed (real local HTTP receivers for the notifiers)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from policy_receivers import Receiver

from auditor.core.job_summary import JobSummary
from auditor.notify import SlackNotifier, WebhookNotifier, slack_escape, verify_signature
from auditor.notify.http import RetryPolicy, retry_after_seconds
from auditor.policy.backtest import walk_ladder
from auditor.policy.escalation import ViolationState, due_step
from auditor.policy.evaluate import JobFacts, evaluate
from auditor.policy.examples import NOW, example_buckets
from auditor.policy.loader import PolicyError, parse_policies

P = """apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {name: p}
spec:
  mode: warn
  verdicts: [low_sm_efficiency]
  sustained:
    for: 30m
    conditions: [{field: sm_active, op: "<=", value: 0.3}]
  escalation:
    - actions: [annotate]
    - actions: [notify]
      after: 10m
      cooldown: 5m
"""
SUM = {"cluster": "c", "namespace": "n", "job": "Job/j", "team": "t", "verdict": "low_sm_efficiency", "sm_active": 0.1}
EX = JobSummary.example(**SUM)


def test_errors_name_file_and_line() -> None:
    with pytest.raises(PolicyError) as e:
        parse_policies(P.replace("  mode: warn", "  mode: warn\n  colour: red"), "x.yaml")
    assert e.value.problems == ["x.yaml:6: spec.colour: unknown field"]
    with pytest.raises(PolicyError) as e:
        parse_policies("a: [1,\n", "y.yaml")
    assert e.value.problems[0].startswith("y.yaml:2: not valid YAML")
    with pytest.raises(PolicyError, match="requeue must come after"):
        parse_policies(P.replace("[annotate]", "[requeue]"), "z.yaml")


def test_missing_data_never_fires() -> None:
    (p,) = parse_policies(P, "p.yaml")
    assert evaluate(p, EX, now=NOW, buckets=example_buckets({"sm_active": 0.1, "minutes": 60})).fires
    assert not evaluate(
        p,
        JobSummary.example(**{**SUM, "verdict": "insufficient_data"}),
        now=NOW,
        buckets=example_buckets({"sm_active": 0.1}),
    ).fires
    assert not evaluate(p, EX, now=NOW, buckets=None).fires
    assert not evaluate(p, EX, now=NOW, buckets=example_buckets({"gpu_util": 0.9, "minutes": 60})).fires  # no SM series
    sparse = [b for i, b in enumerate(example_buckets({"sm_active": 0.1, "minutes": 60})) if i % 2]
    assert not evaluate(p, EX, now=NOW, buckets=sparse).fires  # coverage 0.5 < 0.8


def test_exemptions_and_snooze() -> None:
    (p,) = parse_policies(P, "p.yaml")
    b = example_buckets({"sm_active": 0.1, "minutes": 60})
    assert evaluate(p, EX, now=NOW, buckets=b, facts=JobFacts({"gpu-auditor.io/exempt": "true"})).exempt
    assert evaluate(
        p, EX, now=NOW, buckets=b, facts=JobFacts(namespace_annotations={"gpu-auditor.io/exempt": "p,q"})
    ).exempt
    expired = JobFacts({"gpu-auditor.io/exempt": (NOW - timedelta(hours=1)).isoformat()})
    assert not evaluate(p, EX, now=NOW, buckets=b, facts=expired).exempt
    snoozed = evaluate(
        p,
        EX,
        now=NOW,
        buckets=b,
        facts=JobFacts({"gpu-auditor.io/snooze-until": (NOW + timedelta(hours=1)).isoformat()}),
    )
    assert snoozed.fires and snoozed.snoozed


def test_escalation_order_and_cooldowns() -> None:
    (p,) = parse_policies(P, "p.yaml")
    st = ViolationState(1, 1, NOW, 0, None)
    assert due_step(p, st, NOW)[0] == 0
    st1 = ViolationState(1, 1, NOW, 1, NOW)
    assert due_step(p, st1, NOW + timedelta(minutes=9)) is None  # after: 10m
    assert due_step(p, st1, NOW + timedelta(minutes=10))[0] == 1
    assert due_step(p, ViolationState(1, 1, NOW, 2, NOW), NOW + timedelta(days=1)) is None
    assert [t - NOW for t, _ in walk_ladder(p, NOW, NOW + timedelta(hours=1))] == [timedelta(0), timedelta(minutes=10)]


def test_slack_escape() -> None:
    s = slack_escape("<!channel> <@U1> <#C1|x> a & b @everyone")
    assert "<" not in s and ">" not in s and "&amp;" in s and "@everyone" not in s


def test_retry_after_parsing() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds("garbage") is None
    assert retry_after_seconds(None) is None


_CLI = str(__import__("pathlib").Path(__import__("sys").executable).with_name("gpu-auditor"))
FAST = RetryPolicy(attempts=4, base=0.01, cap=0.02, max_wait=5, timeout=5)


def test_webhook_retries_5xx_and_429_honouring_retry_after() -> None:
    slept: list[float] = []
    r = Receiver(script=[(503, {}), (429, {"Retry-After": "2"})])
    try:
        d = WebhookNotifier(r.url, "k", retry=FAST, sleep=slept.append).send("test", {"a": "<b>"})
        assert d.ok and d.attempts == 3 and r.statuses == [503, 429, 200]
        assert slept[1] == 2.0
        assert len({x.headers["X-Gpu-Auditor-Delivery"] for x in r.requests}) == 1
        assert all(verify_signature("k", x.body, x.headers["X-Gpu-Auditor-Signature"]) for x in r.requests)
    finally:
        r.close()


def test_no_retry_on_other_4xx() -> None:
    r = Receiver(script=[(400, {})])
    try:
        d = SlackNotifier(r.url, retry=FAST, sleep=lambda s: None).send("hi", [])
        assert not d.ok and d.status == 400 and d.attempts == 1 and len(r.requests) == 1
    finally:
        r.close()


def test_gives_up_after_attempts_and_on_long_retry_after() -> None:
    r = Receiver(default=500)
    try:
        d = WebhookNotifier(r.url, "k", retry=FAST, sleep=lambda s: None).send("t", {})
        assert not d.ok and d.attempts == 4 and len(r.requests) == 4
    finally:
        r.close()
    r = Receiver(script=[(429, {"Retry-After": "3600"})])
    try:
        d = WebhookNotifier(r.url, "k", retry=FAST, sleep=lambda s: None).send("t", {})
        assert not d.ok and len(r.requests) == 1
    finally:
        r.close()


def test_cli_validate_and_simulate(tmp_path) -> None:
    import json
    import subprocess
    from datetime import datetime, timezone

    from auditor.core.model import JobRef
    from auditor.store import Store

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "p.yaml").write_text(P.replace("mode: warn", "mode: loud"))
    r = subprocess.run([_CLI, "policy", "validate", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and f"{bad / 'p.yaml'}:5: spec.mode" in r.stderr
    r = subprocess.run([_CLI, "policy", "validate", "policies"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

    now = datetime.now(timezone.utc)
    db = f"sqlite:///{tmp_path}/s.db"
    store = Store.open(db)
    jid = store.upsert_job(JobRef("default", "n", "Job", "j", None, "t"), now - timedelta(hours=2), now)
    buckets = example_buckets(
        {"gpu_util": 0.95, "sm_active": 0.1, "minutes": 120}, now=now.replace(second=0, microsecond=0)
    )
    store.replace_buckets(jid, buckets)
    store.save_summary(
        jid,
        JobSummary.example(
            **{
                **SUM,
                "cluster": "default",
                "gpu_util": 0.95,
                "coverage": 0.99,
                "start": (now - timedelta(hours=2)).isoformat(),
                "end": now.isoformat(),
                "window": {"start": (now - timedelta(hours=2)).isoformat(), "end": now.isoformat()},
                "computed_at": now.isoformat(),
            }
        ).to_json(),
    )
    store.close()
    r = subprocess.run(
        [_CLI, "policy", "simulate", "--since", "1d", "--db", db, "--output", "json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)["policies"]["high-util-low-sm"]
    assert len(res["hits"]) == 1 and res["alerts"] == 1 and res["requeues"] == 0


def test_cli_runner_config_is_the_operators_over_the_charts_variables() -> None:
    """``audit --policies --act`` builds its config with the operator's builder, reading the
    variables the Helm chart sets (one name for the webhook key everywhere)."""
    from auditor.cli.policy import runner_config_from_env
    from auditor.policy.config import chart_notifications, runner_config
    from auditor.settings import Settings

    env = {
        "GPU_AUDITOR_SLACK_WEBHOOK_URL": "https://s",
        "GPU_AUDITOR_WEBHOOK_URL": "https://h",
        "GPU_AUDITOR_WEBHOOK_HMAC_KEY": "k",
    }
    cfg = runner_config_from_env("c1", environ=env)
    assert (
        cfg.cluster,
        cfg.default_route.slack_url,
        cfg.default_route.webhook_url,
        cfg.default_route.webhook_secret,
    ) == ("c1", "https://s", "https://h", "k")
    assert cfg == runner_config(Settings(cluster="c1", notifications=chart_notifications()), environ=env)
    assert not cfg.requeue.enabled and cfg.disabled_actions == frozenset()
    # unset or empty: no destination, no key
    empty = runner_config_from_env(environ={"GPU_AUDITOR_WEBHOOK_URL": "", "GPU_AUDITOR_WEBHOOK_HMAC_KEY": ""})
    assert (empty.default_route.slack_url, empty.default_route.webhook_url, empty.default_route.webhook_secret) == (
        None,
        None,
        None,
    )


def test_cli_refuses_the_retired_webhook_key_variable(tmp_path) -> None:
    """GPU_AUDITOR_WEBHOOK_SECRET is not read (webhooks would silently go unsigned): exit 2 naming
    the chart's variable, before any query (the Prometheus here is unreachable, which would be exit 1)."""
    import os
    import subprocess

    from auditor.cli.policy import runner_config_from_env
    from auditor.errors import BadInput

    with pytest.raises(BadInput, match="GPU_AUDITOR_WEBHOOK_SECRET is no longer read.*GPU_AUDITOR_WEBHOOK_HMAC_KEY"):
        runner_config_from_env(environ={"GPU_AUDITOR_WEBHOOK_SECRET": "k", "GPU_AUDITOR_WEBHOOK_HMAC_KEY": "k"})
    env = {**os.environ, "GPU_AUDITOR_WEBHOOK_SECRET": "k"}
    r = subprocess.run(
        [
            _CLI,
            "audit",
            "--prometheus",
            "http://127.0.0.1:9",
            "--prometheus-retries",
            "0",
            "--no-kube",
            "--start",
            "now-1h",
            "--db",
            f"sqlite:///{tmp_path}/a.db",
            "--policies",
            "policies",
            "--act",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 2, r.stderr
    assert "GPU_AUDITOR_WEBHOOK_HMAC_KEY" in r.stderr and "127.0.0.1:9" not in r.stderr


def test_warm_up_is_judged_from_the_job_start_not_the_buckets_read() -> None:
    # the runner reads only the trailing window: 35 minutes of buckets for a 30-minute rule
    (p,) = parse_policies(P, "p.yaml")
    recent = example_buckets({"sm_active": 0.1, "minutes": 35})
    young = evaluate(
        p, JobSummary.example(**SUM, start=(NOW - timedelta(minutes=35)).isoformat()), now=NOW, buckets=recent
    )
    assert not young.fires and "younger than warm-up" in young.reason
    old = evaluate(p, JobSummary.example(**SUM, start=(NOW - timedelta(hours=30)).isoformat()), now=NOW, buckets=recent)
    assert old.fires, old.reason


def test_sustained_evidence_lists_fields_in_the_conditions_order() -> None:
    """The evidence is stored and sent as JSON: its key order must not change from run to run
    (it followed a set's order, which differs between processes)."""
    (p,) = parse_policies(
        P.replace(
            "conditions: [{field: sm_active", 'conditions: [{field: gpu_util, op: ">=", value: 0.5}, {field: sm_active'
        ),
        "p.yaml",
    )
    ev = evaluate(p, EX, now=NOW, buckets=example_buckets({"gpu_util": 0.9, "sm_active": 0.1, "minutes": 60}))
    sustained = ev.evidence["sustained"]
    assert list(sustained["means"]) == list(sustained["worst"]) == ["gpu_util", "sm_active"]
