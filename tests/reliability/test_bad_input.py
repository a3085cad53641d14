"""Bad input is refused in one clear message naming where (exit 2): empty cluster names,
duplicate policy names (both file:line), NaN thresholds.

The probes: ``--cluster ''`` was taken (jobs recorded under an empty cluster; as a filter it
meant every cluster); a policy name defined twice was reported without a line; NaN thresholds
(found already refused at this commit, kept here as probes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.cli.main import main
from auditor.policy.loader import PolicyRegistry

ROOT = Path(__file__).resolve().parents[2]
POLICY = (ROOT / "policies/idle-gpus/policy.yaml").read_text()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse refuses a bad flag value itself
        rc = int(exc.code or 0)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["audit", "--no-kube", "--start", "now-1h", "--prometheus", "http://127.0.0.1:1", "--cluster", ""],
        ["explain", "ns/Pod/p", "--cluster", ""],
        ["report", "--week", "2026-W48", "--cluster", " "],
        ["actions", "--cluster", "a\x1b[2Jb"],
        ["run", "--once", "--cluster", ""],
    ],
)
def test_an_empty_or_odd_cluster_name_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = cli(capsys, *argv)
    assert rc == 2
    assert "argument --cluster: " in err and "a cluster name must not" in err
    assert "\x1b" not in err


def test_an_empty_cluster_in_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("GPU_AUDITOR_CLUSTER", "")
    rc, err = cli(capsys, "explain", "ns/Pod/p")
    assert rc == 2
    assert err.strip() == (
        "gpu-auditor: error: environment: cluster (variable GPU_AUDITOR_CLUSTER): a cluster name must not be empty"
    )


def test_a_policy_name_defined_twice_names_both_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.yaml").write_text(POLICY)
    (tmp_path / "b.yaml").write_text("# the same policy, copied\n---\n" + POLICY)
    rc, err = cli(capsys, "policy", "validate", str(tmp_path))
    assert rc == 2
    assert f"{tmp_path}/b.yaml:6: policy 'idle-gpus' is already defined in {tmp_path}/a.yaml:4" in err


def test_the_operator_names_the_lines_of_a_duplicate_too() -> None:
    registry = PolicyRegistry()
    problems = registry.update({"a.yaml": POLICY, "b.yaml": "\n\n" + POLICY})
    assert problems == ["b.yaml:6: policy 'idle-gpus' is already defined in a.yaml:4; ignored"]


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_a_non_finite_policy_threshold_is_refused_with_its_line(value: str, tmp_path: Path, capsys) -> None:
    (tmp_path / "p.yaml").write_text(POLICY.replace("value: 0.05}", f"value: {value}}}"))
    rc, err = cli(capsys, "policy", "validate", str(tmp_path))
    assert rc == 2
    assert f"{tmp_path}/p.yaml:16: spec.sustained.conditions.0.value: gpu_util:" in err and "not a finite number" in err


def test_a_non_finite_settings_threshold_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "s.yaml").write_text("thresholds:\n  low_sm: .nan\n")
    rc, err = cli(capsys, "explain", "ns/Pod/p", "--config", str(tmp_path / "s.yaml"))
    assert rc == 2
    assert err.strip() == f"gpu-auditor: error: {tmp_path}/s.yaml: thresholds.low_sm: nan is not a finite number"


@pytest.mark.parametrize(
    "text, line",
    [
        ("cluster: a\ncluster: b\n", "s.yaml:2: not valid YAML: duplicate key 'cluster'"),
        ("cluster: a\nprometheus:\n  url: [x\n", "s.yaml:4: not valid YAML: expected ',' or ']'"),
    ],
)
def test_a_broken_settings_file_is_one_line_with_file_and_line(text: str, line: str, tmp_path: Path, capsys) -> None:
    """Probes of the issue's list (a 7-line YAML message without file:line; duplicate keys taken
    silently), found fixed with the YAML bounds at this commit and kept."""
    (tmp_path / "s.yaml").write_text(text)
    rc, err = cli(capsys, "explain", "ns/Pod/p", "--config", str(tmp_path / "s.yaml"))
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"gpu-auditor: error: settings file {tmp_path}/{line}")
