"""A condition's value must be in its field's unit and range (``value: 90`` for a ratio never
fires), the escalation block is required with a hint, and ``policy validate`` takes a file or a
directory. No servers: the real CLI in a subprocess and the real loader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from auditor.core.job_summary import JobSummary
from auditor.policy.evaluate import evaluate
from auditor.policy.examples import NOW
from auditor.policy.loader import PolicyError, parse_policies
from auditor.policy.schema import SUMMARY_FIELDS, SUSTAINED_FIELDS

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "auditor.cli.main"]

BASE = """apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {name: p}
spec:
  mode: warn
  conditions:
    - field: FIELD
      op: "<"
      value: VALUE
  escalation:
    - actions: [annotate]
"""


def policy(field: str, value: str) -> str:
    return BASE.replace("FIELD", field).replace("VALUE", value)


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as err:
        parse_policies(text, "p.yaml")
    return err.value.problems


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            "sm_active",
            "90",
            "p.yaml:9: spec.conditions.0.value: sm_active: 90 is out of range (0–1 ratio); "
            "ratios are 0–1: did you mean 0.9?",
        ),
        (
            "coverage",
            "1.5",
            "p.yaml:9: spec.conditions.0.value: coverage: 1.5 is out of range (0–1 ratio); "
            "ratios are 0–1: did you mean 0.015?",
        ),
        ("gpu_util", "-0.2", "p.yaml:9: spec.conditions.0.value: gpu_util: -0.2 is out of range (0–1 ratio)"),
        ("mfu_estimate", "250", "p.yaml:9: spec.conditions.0.value: mfu_estimate: 250 is out of range (0–1 ratio)"),
        (
            "sm_clock_mhz",
            "1410000000",
            "p.yaml:9: spec.conditions.0.value: sm_clock_mhz: 1.41e+09 is out of range "
            "(0–10000 MHz); clocks are in MHz: did you mean 1410?",
        ),
        ("power_w", "-5", "p.yaml:9: spec.conditions.0.value: power_w: -5 is out of range (0–5000 W)"),
        ("gpu_hours", "-1", "p.yaml:9: spec.conditions.0.value: gpu_hours: -1 is out of range (≥ 0 GPU-hours)"),
        ("gpus", ".nan", "p.yaml:9: spec.conditions.0.value: gpus: nan is not a finite number"),
    ],
)
def test_out_of_range_values_are_refused_with_file_line_and_hint(field, value, message):
    assert problems(policy(field, value)) == [message]


def test_values_at_the_bounds_and_in_other_units_are_accepted():
    for field, value in [
        ("sm_active", "0"),
        ("sm_active", "1"),
        ("power_w", "700"),
        ("fb_used_mib", "81559"),
        ("sm_clock_mhz", "1980"),
        ("gpu_hours", "100"),
        ("gpus", "0.5"),
    ]:
        (p,) = parse_policies(policy(field, value), "p.yaml")
        assert p.spec.conditions[0].value == float(value)


def test_every_field_has_a_unit_and_sustained_fields_are_summary_fields():
    assert set(SUSTAINED_FIELDS) <= set(SUMMARY_FIELDS)
    assert all(SUMMARY_FIELDS[f].unit for f in SUMMARY_FIELDS)


def test_sustained_conditions_and_min_coverage_are_checked_too():
    text = """apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {name: p}
spec:
  sustained:
    for: 30m
    minCoverage: 80
    conditions:
      - {field: gpu_util, op: ">=", value: 80}
  escalation: [{actions: [annotate]}]
"""
    assert problems(text) == [
        "p.yaml:7: spec.sustained.minCoverage: 80 is out of range (0–1 ratio); ratios are 0–1: did you mean 0.8?",
        "p.yaml:9: spec.sustained.conditions.0.value: gpu_util: 80 is out of range (0–1 ratio); "
        "ratios are 0–1: did you mean 0.8?",
    ]


def test_the_ratio_written_as_the_hint_says_fires():
    """What the refused policy meant (0.9, not 90) matches a job at SM activity 0.5."""
    (p,) = parse_policies(policy("sm_active", "0.9"), "p.yaml")
    summary = JobSummary.example(verdict="low_sm_efficiency", sm_active=0.5)
    assert evaluate(p, summary, now=NOW).fires


def test_missing_escalation_is_required_with_an_example():
    text = BASE.replace("FIELD", "sm_active").replace("VALUE", "0.3").split("  escalation:")[0]
    (msg,) = problems(text)
    assert msg.startswith(
        "p.yaml:4: spec.escalation: required: the ordered action steps, at least one, e.g. "
        "escalation: [{actions: [annotate, event]}]"
    ), msg


def _validate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "policy", "validate", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_validate_takes_a_single_file_and_runs_its_suite(tmp_path):
    r = _validate("policies/idle-gpus/policy.yaml")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["ok  idle-gpus  (mode warn, 2 step(s))", "1 policy valid"]
    # the suite next to the file runs: break it and validate the file alone
    (tmp_path / "policy.yaml").write_text((ROOT / "policies/idle-gpus/policy.yaml").read_text())
    (tmp_path / "suite.yaml").write_text(
        "fire:\n  - name: never idle\n    summary: {verdict: healthy, gpu_util: 0.99}\n"
    )
    r = _validate(str(tmp_path / "policy.yaml"))
    assert r.returncode == 1 and "suite failure" in r.stderr and "never idle" in r.stderr


def test_validate_a_bad_file_names_file_and_line(tmp_path):
    bad = tmp_path / "mine.yaml"
    bad.write_text(policy("sm_active", "90"))
    r = _validate(str(bad))
    assert r.returncode == 2
    assert (
        f"{bad}:9: spec.conditions.0.value: sm_active: 90 is out of range (0–1 ratio); ratios are 0–1: did you mean 0.9?"
        in r.stderr
    )


@pytest.mark.parametrize(
    "name, message",
    [
        ("missing.yaml", "missing.yaml: no such file or directory"),
        ("suite.yaml", "suite.yaml: an example suite, not a policy"),
        ("notes.txt", "notes.txt: not a policy file (policies are .yaml or .yml)"),
        ("empty-dir", "empty-dir: no policy files (*.yaml, *.yml) in it"),
    ],
)
def test_validate_refuses_what_is_not_a_policy(tmp_path, name, message):
    (tmp_path / "suite.yaml").write_text("fire: []\n")
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "empty-dir").mkdir()
    r = _validate(str(tmp_path / name))
    assert r.returncode == 2 and message in r.stderr, r.stderr
