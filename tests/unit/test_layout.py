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
