"""``operator/`` must never shadow the standard library's ``operator`` module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_operator_folder_has_no_init():
    assert (REPO / "operator").is_dir()
    assert not (REPO / "operator" / "__init__.py").exists()
    assert not list((REPO / "operator").glob("*.py")), "no top-level .py files in operator/"


def test_import_operator_is_the_stdlib_with_the_repo_root_on_sys_path():
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import operator, sysconfig, os; "
        "std = os.path.realpath(sysconfig.get_paths()['stdlib']); "
        "f = getattr(operator, '__file__', None); "
        "assert f is not None and os.path.realpath(f).startswith(std), f; "
        "assert operator.itemgetter(1)([0, 7]) == 7; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_the_operator_folder_holds_the_image_only_and_its_context_leaves_out_the_test_bed():
    """The operator's code is auditor/operator_loop/ (operator/README.md); operator/ has the image
    files, and the image's build context keeps auditor/testbed (dev-only imports) out, as the
    wheel does (tests/chart/test_image.py::test_wheel_leaves_out_the_test_bed)."""
    assert sorted(p.name for p in (REPO / "operator").iterdir()) == [
        "Dockerfile",
        "Dockerfile.dockerignore",
        "README.md",
    ]
    assert (REPO / "auditor" / "operator_loop" / "service.py").is_file()
    rules = [r.strip() for r in (REPO / "operator" / "Dockerfile.dockerignore").read_text().splitlines()]
    rules = [r for r in rules if r and not r.startswith("#")]
    # the last rule that matches a path wins: the test bed's exclusion comes after auditor/ is let in
    assert rules.index("auditor/testbed") > rules.index("!auditor/")
    assert not [r for r in rules[rules.index("auditor/testbed") + 1 :] if r.startswith("!auditor")]
