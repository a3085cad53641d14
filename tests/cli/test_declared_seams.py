"""Issue 31, step 1: the audit use-case and the operator's cycle use only what their ports
declare. A capability found at run time (``getattr``/``hasattr`` on an object, a ``cast``, a
``__getattr__`` that forwards anything) is a seam mypy cannot follow: this keeps it from coming
back into the modules where the data is written."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEAMS = [REPO / "auditor" / "engine.py", *sorted((REPO / "auditor" / "operator_loop").glob("*.py"))]
DISCOVERY_CALLS = {"getattr", "hasattr", "cast"}


def _discovery(source: str, name: str) -> list[str]:
    """``name:line: what`` for each run-time capability lookup in ``source``, in line order."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in DISCOVERY_CALLS:
            found.append((node.lineno, f"{node.func.id}()"))
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            found.append((node.lineno, "def __getattr__"))
    return [f"{name}:{line}: {what}" for line, what in sorted(found)]


@pytest.mark.parametrize("path", SEAMS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_capability_is_discovered_at_run_time(path: Path) -> None:
    found = _discovery(path.read_text(), str(path.relative_to(REPO)))
    assert found == [], "declare the call on its port (auditor/ports.py) instead"


def test_the_check_sees_what_it_forbids() -> None:
    bad = "class P:\n    def __getattr__(self, n):\n        return getattr(self._x, n)\nhasattr(1, 'a')\n"
    assert _discovery(bad, "bad.py") == ["bad.py:2: def __getattr__", "bad.py:3: getattr()", "bad.py:4: hasattr()"]
