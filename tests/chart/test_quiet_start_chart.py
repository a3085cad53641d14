"""The chart's ``mode`` (issue 30, a quiet start): a new install audits (decides, records, writes
nothing to users' objects, sends nothing) until ``--set mode=enforce``. Rendered by the test bed's
real helm and read back through the operator's own settings loader and runner configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
from chartlib import Chart, find

from auditor.policy.config import runner_config
from auditor.settings import Settings, load_settings

pytestmark = pytest.mark.testbed


def _settings(chart: Chart, tmp_path: Path, *sets: str) -> Settings:
    (cm,) = find(chart.render(sets=list(sets)), "ConfigMap", "ga-gpu-auditor-settings")
    path = tmp_path / "settings.yaml"
    path.write_text(cm["data"]["settings.yaml"])
    return load_settings(path, environ={})


def test_a_new_install_audits_and_one_value_enforces(chart: Chart, tmp_path: Path) -> None:
    quiet = _settings(chart, tmp_path)
    assert quiet.mode == "audit" and runner_config(quiet, environ={}).audit_only is True
    loud = _settings(chart, tmp_path, "mode=enforce")
    assert loud.mode == "enforce" and runner_config(loud, environ={}).audit_only is False


def test_the_gate_keeps_its_own_mode(chart: Chart, tmp_path: Path) -> None:
    """The efficiency gate is off unless enabled and answers Kueue's AdmissionChecks in its own
    ``gate.mode`` (docs/gate.md): an admin who sets it to enforce gets enforce, whatever ``mode``."""
    assert _settings(chart, tmp_path, "gate.enabled=true", "gate.mode=enforce").gate.mode == "enforce"


def test_another_mode_fails_the_install(chart: Chart) -> None:
    res = chart.template_text(sets=["mode=quiet"], check=False)
    assert res.rc != 0 and "value must be one of 'audit', 'enforce'" in res.err  # the schema refuses it
