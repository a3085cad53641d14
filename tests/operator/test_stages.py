"""How the operator turns settings into its policy and report stages (no servers needed)."""

from __future__ import annotations

import pytest

from auditor.errors import BadInput
from auditor.operator_loop.policies import builtin_policy_dir, policy_files, runner_config
from auditor.operator_loop.reports import ReportStage
from auditor.policy.schema import ActionKind
from auditor.settings import load_settings


def settings(**overrides):
    return load_settings(None, environ={}, overrides=overrides)


def test_runner_config_takes_routes_requeue_scope_and_feature_switches() -> None:
    s = settings(
        features={"annotate": False, "events": True, "requeue": True},
        requeue={"namespaces": ["ml"], "queues": ["lq"], "max_per_hour": 2},
        notifications={
            "slack": {"webhook_url_env": "SLACK"},
            "webhook": {"url_env": "HOOK", "hmac_key_env": "KEY"},
            "routes": {"vision": {"slack_webhook_url_env": "VISION_SLACK"}},
        },
    )
    cfg = runner_config(s, environ={"SLACK": "https://s", "HOOK": "https://h", "KEY": "k", "VISION_SLACK": "https://v"})
    assert (cfg.default_route.slack_url, cfg.default_route.webhook_url, cfg.default_route.webhook_secret) == (
        "https://s",
        "https://h",
        "k",
    )
    assert cfg.routes["vision"].slack_url == "https://v"
    assert cfg.disabled_actions == frozenset({ActionKind.ANNOTATE})
    assert cfg.requeue.enabled and cfg.requeue.max_per_hour == 2
    assert cfg.requeue.allows({"namespace": "ml"}) is None
    assert cfg.requeue.allows({"namespace": "other", "queue": "lq"}) is None
    assert cfg.requeue.allows({"namespace": "other"}) is not None
    # requeue stays off unless features.requeue says so, whatever the scope
    off = runner_config(settings(requeue={"namespaces": ["ml"]}), environ={})
    assert off.requeue.allows({"namespace": "ml"}) == "requeue is disabled (settings)"


def test_policy_files_merge_the_shipped_policies_with_the_mounted_dir(tmp_path) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "mine.yaml").write_text("apiVersion: gpu-auditor.io/v1alpha1\n")
    (extra / "mine.suite.yaml").write_text("examples: []\n")  # test examples are not policies
    s = settings(policies={"builtin": True, "dir": str(extra)})
    shipped = builtin_policy_dir(s)
    assert shipped is not None and (shipped / "high-util-low-sm" / "policy.yaml").is_file()
    files = policy_files(s)
    assert str(extra / "mine.yaml") in files and str(extra / "mine.suite.yaml") not in files
    assert any(p.endswith("high-util-low-sm/policy.yaml") for p in files)
    assert list(policy_files(settings(policies={"builtin": False, "dir": str(extra)}))) == [str(extra / "mine.yaml")]


def test_report_stage_is_off_with_an_empty_schedule_and_refuses_bad_ones() -> None:
    assert ReportStage(settings(reports={"weekly_schedule": ""}), store=None).enabled is False
    stage = ReportStage(settings(reports={"weekly_schedule": "0 8 * * 1", "timezone": "Europe/Berlin"}), store=None)
    assert stage.enabled and stage.options.timezone == "Europe/Berlin"
    with pytest.raises(BadInput):
        ReportStage(settings(reports={"weekly_schedule": "every monday"}), store=None)
    with pytest.raises(BadInput):
        ReportStage(settings(reports={"timezone": "Mars/Olympus"}), store=None)
