"""Each shipped policy's examples: what must fire fires, what must not stays quiet."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.policy.examples import run_suite
from auditor.policy.loader import load_dir, parse_policies

HERE = Path(__file__).parent
DIRS = sorted(p.parent for p in HERE.glob("*/policy.yaml"))


def test_shipped_policies_validate() -> None:
    names = {p.name for p in load_dir(HERE)}
    assert {"high-util-low-sm", "idle-gpus", "memory-bound", "no-tensor-cores", "underutilized"} <= names
    assert {"mfu-gap", "mfu-below-own-best"} <= names  # issue 28


def test_modes_are_as_documented() -> None:
    modes = {p.name: p.spec.mode.value for p in load_dir(HERE)}
    assert modes["high-util-low-sm"] == "warn" and modes["idle-gpus"] == "warn"
    assert modes["memory-bound"] == modes["no-tensor-cores"] == modes["underutilized"] == "audit"
    # the MFU gap is a headline loss (warn, like the utilization lie); a regression is advice (audit)
    assert modes["mfu-gap"] == "warn" and modes["mfu-below-own-best"] == "audit"


@pytest.mark.parametrize("d", DIRS, ids=[d.name for d in DIRS])
def test_suite(d: Path) -> None:
    suite = d / "suite.yaml"
    assert suite.exists(), f"{d} has no suite.yaml"
    (policy,) = parse_policies((d / "policy.yaml").read_text(), str(d / "policy.yaml"))
    assert run_suite(policy, suite) == []
