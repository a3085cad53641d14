"""A deeply nested settings or policy file is refused in one line naming the file and line (exit 2).

The probe (issue 35): ``[`` × 600 (1.2 kB) in a settings or policy file ended in a
``RecursionError`` traceback and exit 1: PyYAML composes nodes recursively, and the stack ran
out before any of our bounds (size, values) was reached. Now a document nested deeper than
:data:`auditor.yamldoc.MAX_DEPTH` levels is refused where the level past the bound opens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.cli.main import main
from auditor.policy.loader import PolicyRegistry
from auditor.yamldoc import MAX_DEPTH, YamlError, load_documents


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(list(argv))
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("opening", ["[", "{a: "])
def test_deep_nesting_is_a_yaml_error_with_its_line(opening: str) -> None:
    text = "cluster: a\nthresholds:\n  x: " + opening * 600
    with pytest.raises(YamlError, match=f"nested deeper than {MAX_DEPTH} levels") as info:
        load_documents(text, "s.yaml")
    assert info.value.line == 3


def test_nesting_within_the_bound_is_read() -> None:
    depth = MAX_DEPTH - 2  # the top mapping is one level, the key's value another
    (doc,) = load_documents("a: " + "[" * depth + "]" * depth, "s.yaml")
    value = doc.value["a"]
    for _ in range(depth - 1):
        (value,) = value
    assert value == []


def test_a_deep_settings_file_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("cluster: a\nthresholds: " + "[" * 600 + "\n")
    rc, err = cli(capsys, "explain", "ns/Pod/p", "--config", str(path))
    assert rc == 2
    assert err.strip() == (
        f"gpu-auditor: error: settings file {path}:2: not valid YAML: nested deeper than {MAX_DEPTH} levels; refused"
    )


def test_a_deep_policy_file_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.yaml").write_text("kind: GpuPolicy\nspec: " + "[" * 600 + "\n")
    rc, err = cli(capsys, "policy", "validate", str(tmp_path))
    assert rc == 2
    assert "RecursionError" not in err and "Traceback" not in err
    assert f"{tmp_path}/p.yaml:2: not valid YAML: nested deeper than {MAX_DEPTH} levels; refused" in err


def test_the_operator_ignores_a_deep_policy_file_and_says_where() -> None:
    problems = PolicyRegistry().update({"deep.yaml": "kind: GpuPolicy\nspec:\n  x: " + "{a: " * 600})
    assert problems == [f"deep.yaml:3: not valid YAML: nested deeper than {MAX_DEPTH} levels; refused"]
