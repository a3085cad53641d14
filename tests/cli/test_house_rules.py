"""The house rules (tools/house_rules.py, run by ``make lint``; issue 31, step 5) hold on the tree,
and see what they forbid: a module or function over its budget, a clock read outside the Clock,
a hand-made RFC 3339 instant, ApiException outside auditor/kube/."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("house_rules", REPO / "tools" / "house_rules.py")
assert spec is not None and spec.loader is not None
house_rules = importlib.util.module_from_spec(spec)
spec.loader.exec_module(house_rules)


def test_the_tree_keeps_the_house_rules() -> None:
    out = subprocess.run([sys.executable, "tools/house_rules.py"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_patterns_are_seen_and_a_clock_is_not_mistaken_for_them() -> None:
    source = (
        "import time\nfrom datetime import datetime\n"
        "a = datetime.now()\nb = time.monotonic()\nc = self.clock.monotonic()\nd = self.time.monotonic()\n"
        "e = t.isoformat().replace('+00:00', 'Z')\nf = t.strftime('%Y-%m-%dT%H:%M:%SZ')\ng = day.isoformat()\n"
        "h = t.strftime('%d %b')\ntry:\n    pass\nexcept ApiException:\n    pass\n"
    )
    found = house_rules._calls(ast.parse(source))
    assert dict(found) == {"clock_reads": 2, "timestamp_formats": 2, "api_exceptions": 1}


def test_every_listed_exception_names_its_reason() -> None:
    import tomllib

    cfg = tomllib.loads((REPO / "tools" / "house_rules.toml").read_text())
    entries = [(rule, key, e) for rule, table in cfg.items() if rule != "budget" for key, e in table.items()]
    assert entries and all(str(e.get("why", "")).strip() for _rule, _key, e in entries)
