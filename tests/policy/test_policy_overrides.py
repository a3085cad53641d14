"""An admin overrides one shipped policy by name (issue 30): a policy in ``policies.dir`` with the
name of a shipped one replaces it, said once in the log and by ``policy validate``; a name
defined twice among the admin's own files is still refused. The shipped policies are the real
ones (``policies/``), read through the operator's own :func:`policy_files`."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from auditor.cli.main import main
from auditor.gate.stage import GateRules
from auditor.operator_loop.policies import policy_files
from auditor.policy.loader import PolicyError, PolicyRegistry, load_all
from auditor.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "policies" / "high-util-low-sm" / "policy.yaml"
#: the shipped headline policy, toned down to audit by its admin
QUIET = SHIPPED.read_text().replace("  mode: warn\n", "  mode: audit\n")
REPLACES = f"policy 'high-util-low-sm' replaces the shipped one in {SHIPPED}:5"


def settings(admin_dir: Path) -> Settings:
    return Settings(policies={"builtin": True, "builtin_dir": str(ROOT / "policies"), "dir": str(admin_dir)})


def modes(policies: list) -> dict[str, str]:
    return {p.name: p.spec.mode.value for p in policies if hasattr(p.spec, "escalation")}


def test_an_admin_policy_replaces_the_shipped_one_of_its_name(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert "  mode: warn\n" in SHIPPED.read_text() and QUIET != SHIPPED.read_text()
    (tmp_path / "quiet.yaml").write_text(QUIET)
    shipped = modes(load_all(policy_files(Settings(policies={"builtin_dir": str(ROOT / "policies")}))))
    with caplog.at_level(logging.WARNING, logger="auditor.policy.loader"):
        taken = modes(load_all(policy_files(settings(tmp_path))))
    assert taken == {**shipped, "high-util-low-sm": "audit"}  # the others are the shipped ones
    assert [r.getMessage() for r in caplog.records] == [f"{tmp_path}/quiet.yaml:5: {REPLACES}"]


def test_the_operator_runs_the_override_and_says_so_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "quiet.yaml").write_text(QUIET)
    registry = PolicyRegistry()
    with caplog.at_level(logging.WARNING, logger="auditor.policy.loader"):
        for _ in range(3):  # the operator re-reads the files every cycle
            assert registry.update(policy_files(settings(tmp_path))) == []
    assert modes(registry.policies)["high-util-low-sm"] == "audit"
    assert [r.getMessage() for r in caplog.records] == [f"{tmp_path}/quiet.yaml:5: {REPLACES}"]
    (tmp_path / "quiet.yaml").unlink()  # the override removed: the shipped policy runs again
    assert registry.update(policy_files(settings(tmp_path))) == [] and registry.overrides == []
    assert modes(registry.policies)["high-util-low-sm"] == "warn"


def test_a_name_twice_in_the_admins_own_files_is_still_refused(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(QUIET)
    (tmp_path / "b.yaml").write_text(QUIET)
    with pytest.raises(PolicyError) as exc:
        load_all(policy_files(settings(tmp_path)))
    assert exc.value.problems == [
        f"{tmp_path}/b.yaml:5: policy 'high-util-low-sm' is already defined in {tmp_path}/a.yaml:5"
    ]
    registry = PolicyRegistry()
    assert registry.update(policy_files(settings(tmp_path))) == [
        f"{tmp_path}/b.yaml:5: policy 'high-util-low-sm' is already defined in {tmp_path}/a.yaml:5; ignored"
    ]


def test_a_plain_set_of_files_knows_no_shipped_ones(tmp_path: Path) -> None:
    """Without the operator's layering (shipped, then the admin's) two files of one name are two
    definitions, refused as before."""
    with pytest.raises(PolicyError, match="already defined"):
        load_all({str(SHIPPED): SHIPPED.read_text(), str(tmp_path / "quiet.yaml"): QUIET})


def test_policy_validate_says_which_shipped_policy_a_file_replaces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "quiet.yaml").write_text(QUIET)
    assert main(["policy", "validate", "--no-suites", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{tmp_path}/quiet.yaml:5: {REPLACES}" in out
    assert out.rstrip().endswith("1 policy valid")
    (tmp_path / "again.yaml").write_text(QUIET)
    assert main(["policy", "validate", "--no-suites", str(tmp_path)]) == 2
    assert "is already defined in" in capsys.readouterr().err


def test_policy_validate_of_the_shipped_policies_replaces_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "validate", "--no-suites", str(ROOT / "policies")]) == 0
    assert "replaces the shipped one" not in capsys.readouterr().out


def test_the_gate_runs_an_admins_gate_rule_over_the_shipped_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The efficiency gate reads the same files (GateRules): the admin's rule of a shipped rule's
    name is the one it decides with, and nothing is reported as a duplicate."""
    shipped = ROOT / "policies" / "gate" / "hold-repeated-low-sm.yaml"
    (tmp_path / "hold.yaml").write_text(shipped.read_text().replace("atLeast: 3", "atLeast: 4"))
    rules = GateRules(lambda: policy_files(settings(tmp_path)))
    with caplog.at_level(logging.WARNING, logger="auditor.policy.loader"):
        assert rules.refresh()
    assert {r.name: r.at_least for r in rules.rules}["hold-repeated-low-sm"] == 4
    assert rules.registry.errors == []
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path}/hold.yaml:8: policy 'hold-repeated-low-sm' replaces the shipped one in {shipped}:8"
    ]
