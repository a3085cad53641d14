"""Thresholds from the settings file and ``GPU_AUDITOR_THRESHOLDS__*`` variables, and their use by
``demo`` (``audit`` and ``run`` against the test bed: tests/e2e, tests/operator)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from auditor.cli.main import main
from auditor.core.thresholds import Thresholds
from auditor.errors import BadInput
from auditor.settings import load_settings


def test_settings_file_section_overrides_defaults(tmp_path):
    f = tmp_path / "settings.yaml"
    f.write_text("thresholds:\n  low_sm: 0.4\n  min_span: 2m\n  power_floor_w: {T4: 40}\n")
    th = load_settings(f, environ={}).thresholds
    assert isinstance(th, Thresholds)
    assert (th.low_sm, th.min_span, th.busy_util) == (0.4, timedelta(minutes=2), 0.6)
    assert th.power_floor("Tesla T4") == 40 and th.power_floor("NVIDIA H200") == 250
    assert load_settings(None, environ={}).thresholds == Thresholds()


def test_environment_overrides_the_file_key_by_key(tmp_path):
    f = tmp_path / "settings.yaml"
    f.write_text("thresholds: {low_sm: 0.4, busy_util: 0.7}\n")
    env = {"GPU_AUDITOR_THRESHOLDS__LOW_SM": "0.3", "GPU_AUDITOR_THRESHOLDS__POWER_FLOOR_W__H200": "300"}
    th = load_settings(f, environ=env).thresholds
    assert (th.low_sm, th.busy_util) == (0.3, 0.7)
    assert th.power_floor("NVIDIA H200") == 300


@pytest.mark.parametrize(
    "text, message",
    [
        ("thresholds: {low_smm: 0.4}\n", "settings.yaml: thresholds.low_smm: unknown threshold (known: "),
        (
            "thresholds: {low_sm: 90}\n",
            "settings.yaml: thresholds.low_sm: 90 is out of range (0–1 ratio); ratios are 0–1: did you mean 0.9?",
        ),
        ("thresholds: {low_sm: fast}\n", "settings.yaml: thresholds.low_sm: expected a number (0–1 ratio), got 'fast'"),
        (
            "thresholds: {idle_util: 0.8, busy_util: 0.5}\n",
            "settings.yaml: thresholds.idle_util: idle_util (0.8) must not exceed busy_util (0.5)",
        ),
        ("thresholds: [low_sm]\n", "settings.yaml: thresholds: expected a mapping of threshold → value"),
    ],
)
def test_bad_file_values_name_the_file_and_key(tmp_path, text, message):
    f = tmp_path / "settings.yaml"
    f.write_text(text)
    with pytest.raises(BadInput) as err:
        load_settings(f, environ={})
    assert str(err.value).startswith(f"{tmp_path}/{message}"), str(err.value)


@pytest.mark.parametrize(
    "name, value, message",
    [
        (
            "GPU_AUDITOR_THRESHOLDS__LOW_SM",
            "50",
            "environment: thresholds.low_sm (variable GPU_AUDITOR_THRESHOLDS__LOW_SM): 50 is out of range (0–1 ratio); "
            "ratios are 0–1: did you mean 0.5?",
        ),
        (
            "GPU_AUDITOR_THRESHOLDS__LOW_SMM",
            "0.5",
            "environment: thresholds.low_smm (variable GPU_AUDITOR_THRESHOLDS__LOW_SMM): unknown threshold",
        ),
        (
            "GPU_AUDITOR_THRESHOLDS__POWER_FLOOR_W__H200",
            "lots",
            "environment: thresholds.power_floor_w.h200 (variable GPU_AUDITOR_THRESHOLDS__POWER_FLOOR_W__H200): "
            "expected a number (0–5000 W), got 'lots'",
        ),
    ],
)
def test_bad_variables_name_the_variable(name, value, message):
    with pytest.raises(BadInput) as err:
        load_settings(None, environ={name: value})
    assert str(err.value).startswith(message), str(err.value)


def test_effective_settings_log_shows_thresholds():
    masked = load_settings(None, environ={"GPU_AUDITOR_THRESHOLDS__MIN_SPAN": "90s"}).masked()
    assert masked["thresholds"]["min_span"] == 90.0 and masked["thresholds"]["low_sm"] == 0.5
    json.dumps(masked)


def test_demo_uses_configured_thresholds(tmp_path, capsys, monkeypatch):
    """``demo --config``: Job/kernel-debug (SM activity 0.030) is low_sm_efficiency by default and
    is not once low_sm is 0.02; the audit run records the thresholds it used."""
    monkeypatch.delenv("GPU_AUDITOR_CONFIG", raising=False)
    assert main(["demo", "--out", str(tmp_path / "default"), "--no-html"]) == 0
    default = {s["job"]: s for s in json.loads((tmp_path / "default" / "summaries.json").read_text())}
    assert default["Job/kernel-debug"]["verdict"] == "low_sm_efficiency"

    cfg = tmp_path / "settings.yaml"
    cfg.write_text("thresholds: {low_sm: 0.02}\n")
    assert main(["demo", "--out", str(tmp_path / "tuned"), "--no-html", "--config", str(cfg)]) == 0
    tuned = {s["job"]: s for s in json.loads((tmp_path / "tuned" / "summaries.json").read_text())}
    assert tuned["Job/kernel-debug"]["verdict"] == "memory_bound"  # SM 0.030 ≥ 0.02, no pipe does math
    assert tuned["Job/spin-test"]["verdict"] == "low_sm_efficiency"  # SM 0.0076 < 0.02 still

    from auditor.store import Store

    store = Store.open(f"sqlite:///{tmp_path / 'tuned' / 'demo.sqlite'}")
    try:
        (run,) = store.runs(limit=5)
    finally:
        store.close()
    assert run["detail"]["thresholds"]["low_sm"] == 0.02
    capsys.readouterr()


def test_demo_refuses_bad_threshold_variables(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GPU_AUDITOR_CONFIG", raising=False)
    monkeypatch.setenv("GPU_AUDITOR_THRESHOLDS__LOW_SM", "90")
    assert main(["demo", "--out", str(tmp_path), "--no-html"]) == 2
    assert "GPU_AUDITOR_THRESHOLDS__LOW_SM" in capsys.readouterr().err
    assert not (tmp_path / "demo.sqlite").exists()  # refused before anything ran
