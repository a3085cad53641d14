"""The ``mfu:`` settings section (issue 28): workload classes with their selectors and reference
MFUs, ``lineage_best``, from the file and from ``GPU_AUDITOR_MFU__*`` variables; bad values name
the key (and the variable) and stop the command with exit 2."""

from __future__ import annotations

import pytest

from auditor import compose
from auditor.cli.main import main
from auditor.core.mfu import CLASS_LABEL, DEFAULT_CLASSES, WorkloadClass
from auditor.errors import BadInput
from auditor.settings import load_settings

FILE = """
mfu:
  lineage_best: false
  classes:
    - name: llm-pretrain
      reference_mfu: 0.42
      namespaces: [llm-*]
      labels: {gpu-auditor.io/workload-class: llm-training}
    - name: batch-low
      reference_mfu: 0.3
      teams: [research]
      priority_classes: [batch-*]
    - name: serving
      serving: true
      namespaces: [serve]
    - name: everything-else
"""


def test_defaults_are_the_shipped_classes_and_the_lineage_best() -> None:
    s = load_settings(None, environ={})
    assert s.mfu.classes is None and s.mfu.lineage_best is True
    plan = compose.mfu_plan(s)
    assert plan.classes == DEFAULT_CLASSES and plan.lineage_best is True
    assert any(c.labels == ((CLASS_LABEL, "llm-training"),) and c.reference_mfu for c in plan.classes)


def test_the_file_replaces_the_classes_in_order(tmp_path) -> None:
    f = tmp_path / "settings.yaml"
    f.write_text(FILE)
    plan = compose.mfu_plan(load_settings(f, environ={}))
    assert plan.lineage_best is False
    assert plan.classes == (
        WorkloadClass("llm-pretrain", 0.42, namespaces=("llm-*",), labels=((CLASS_LABEL, "llm-training"),)),
        WorkloadClass("batch-low", 0.3, teams=("research",), priority_classes=("batch-*",)),
        WorkloadClass("serving", None, serving=True, namespaces=("serve",)),
        WorkloadClass("everything-else", None),
    )


def test_variables_set_the_section(tmp_path) -> None:
    f = tmp_path / "settings.yaml"
    f.write_text(FILE)
    env = {
        "GPU_AUDITOR_MFU__LINEAGE_BEST": "true",
        "GPU_AUDITOR_MFU__CLASSES": '[{"name": "ml", "reference_mfu": 0.38, "namespaces": ["ml"]}]',
    }
    s = load_settings(f, environ=env)
    assert s.mfu.lineage_best is True
    assert s.mfu.workload_classes() == (WorkloadClass("ml", 0.38, namespaces=("ml",)),)
    assert load_settings(None, environ={"GPU_AUDITOR_MFU__CLASSES": "[]"}).mfu.workload_classes() == ()


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "mfu: {classes: [{name: llm, reference_mfu: 40}]}\n",
            "mfu.classes.0.reference_mfu: 40 is not an MFU: a ratio above 0 and at most 1: did you mean 0.4?",
        ),
        ("mfu: {classes: [{name: llm, reference_mfu: 0}]}\n", "mfu.classes.0.reference_mfu: 0 is not an MFU"),
        ("mfu: {classes: [{name: llm, refrence_mfu: 0.4}]}\n", "unknown key mfu.classes.0.refrence_mfu"),
        ("mfu: {classes: [{reference_mfu: 0.4}]}\n", "mfu.classes.0.name: Field required"),
        ("mfu: {classes: [{name: a}, {name: a}]}\n", "mfu.classes: class name(s) given twice: a"),
        ("mfu: {classes: [{name: lineage-best}]}\n", "mfu.classes.0.name: 'lineage-best' names the lineage's own"),
        ("mfu: {classes: [{name: a, namespaces: ['']}]}\n", "mfu.classes.0.namespaces: an empty pattern matches"),
        ("mfu: {classes: [{name: a, labels: {'': x}}]}\n", "mfu.classes.0.labels: a label selector needs a key"),
        ("mfu: {lineage_best: sometimes}\n", "mfu.lineage_best: Input should be a valid boolean"),
        ("mfu: {classes: {name: a}}\n", "mfu.classes: Input should be a valid list"),
    ],
)
def test_bad_values_name_the_file_and_the_key(tmp_path, text: str, message: str) -> None:
    f = tmp_path / "settings.yaml"
    f.write_text(text)
    with pytest.raises(BadInput) as err:
        load_settings(f, environ={})
    assert str(err.value).startswith(f"{f}: ") and message in str(err.value), str(err.value)


def test_a_bad_variable_is_named() -> None:
    env = {"GPU_AUDITOR_MFU__CLASSES": '[{"name": "x", "reference_mfu": 45}]'}
    with pytest.raises(BadInput) as err:
        load_settings(None, environ=env)
    assert str(err.value) == (
        "environment: mfu.classes.0.reference_mfu (variable GPU_AUDITOR_MFU__CLASSES): "
        "45 is not an MFU: a ratio above 0 and at most 1: did you mean 0.45?"
    )
    with pytest.raises(BadInput, match=r"mfu.classes \(variable GPU_AUDITOR_MFU__CLASSES\): expected a JSON list"):
        load_settings(None, environ={"GPU_AUDITOR_MFU__CLASSES": "llm=0.4"})


def test_a_command_stops_with_exit_2_naming_the_key(tmp_path, capsys) -> None:
    f = tmp_path / "settings.yaml"
    f.write_text("mfu: {classes: [{name: llm, reference_mfu: 1.5}]}\n")
    assert main(["demo", "--no-html", "--out", str(tmp_path / "out"), "--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert "mfu.classes.0.reference_mfu: 1.5 is not an MFU" in err
    assert not (tmp_path / "out").exists()
